"""The healing endpoint's URLs; a project includes them under a prefix of its own (the demo: ``streamrecover/proxy/``).

Anthropic SDK: ``base_url=<site><prefix>``; OpenAI SDK (Chat Completions and Responses): ``base_url=<site><prefix>/v1``.
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "streamrecover-proxy"

urlpatterns = [
    path("v1/messages", views.messages, name="messages"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/responses", views.responses, name="responses"),
]
