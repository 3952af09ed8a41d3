"""The healing endpoint's URLs; a project includes them under a prefix of its own (the demo: ``streamrecover/proxy/``).

Anthropic SDK: ``base_url=<site><prefix>``; OpenAI SDK (Chat Completions and Responses): ``base_url=<site><prefix>/v1``;
google-genai: ``HttpOptions(base_url=<site><prefix>)``.
"""

from __future__ import annotations

from django.urls import path, re_path

from . import views

app_name = "streamrecover-proxy"

urlpatterns = [
    path("v1/messages", views.messages, name="messages"),
    path("v1/chat/completions", views.chat_completions, name="chat-completions"),
    path("v1/responses", views.responses, name="responses"),
    re_path(
        r"^(?P<version>v1|v1beta|v1alpha)/models/(?P<model>[^/:]+):(?P<method>streamGenerateContent|generateContent)$",
        views.generate_content,
        name="gemini",
    ),
]
