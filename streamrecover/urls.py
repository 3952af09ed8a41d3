"""The app's pages; the project includes them under ``streamrecover/``."""

from __future__ import annotations

from django.urls import path

from . import views_api, views_chat

app_name = "streamrecover"

urlpatterns = [
    # The demo chat.
    path("", views_chat.chat, name="chat"),
    path("threads/<int:thread_id>/", views_chat.chat, name="chat-thread"),
    path("login/", views_chat.ChatLoginView.as_view(), name="login"),
    path("logout/", views_chat.ChatLogoutView.as_view(), name="logout"),
    # The JSON API (session auth + CSRF).
    path("api/runs/", views_api.create_run, name="api-runs"),
    path("api/runs/<uuid:run_id>/", views_api.run_detail, name="api-run"),
    path("api/runs/<uuid:run_id>/cancel/", views_api.cancel_run, name="api-run-cancel"),
    path("api/threads/", views_api.thread_list, name="api-threads"),
    path("api/threads/<int:thread_id>/", views_api.thread_detail, name="api-thread"),
]
