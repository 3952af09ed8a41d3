"""The demo chat's pages: chat, thread, log in, log out (the demo project mounts them under ``streamrecover/``)."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "demo"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("threads/<int:thread_id>/", views.chat, name="chat-thread"),
    path("login/", views.ChatLoginView.as_view(), name="login"),
    path("logout/", views.ChatLogoutView.as_view(), name="logout"),
]
