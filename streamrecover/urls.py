"""The app's JSON API (session auth + CSRF); a host project includes it, e.g. under ``streamrecover/``.

Nothing else: the analytics page is opt-in (``streamrecover.analytics.urls``), the run's
WebSocket route is in ``streamrecover.routing``, and the chat page is opt-in too
(``streamrecover.chat.urls``).
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "streamrecover"

urlpatterns = [
    path("api/runs/", views.create_run, name="api-runs"),
    path("api/runs/<uuid:run_id>/", views.run_detail, name="api-run"),
    path("api/runs/<uuid:run_id>/cancel/", views.cancel_run, name="api-run-cancel"),
    path("api/threads/", views.thread_list, name="api-threads"),
    path("api/threads/<int:thread_id>/", views.thread_detail, name="api-thread"),
]
