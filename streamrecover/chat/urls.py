"""The opt-in chat page: ``path("chat/", include("streamrecover.chat.urls"))`` in a host's URLconf."""

from __future__ import annotations

from django.urls import path

from .views import ChatView

app_name = "streamrecover_chat"

urlpatterns = [
    path("", ChatView.as_view(), name="chat"),
    path("threads/<int:thread_id>/", ChatView.as_view(), name="chat-thread"),
]
