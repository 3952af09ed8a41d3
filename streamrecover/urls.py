"""The app's JSON API (session auth + CSRF); a host project includes it, e.g. under ``streamrecover/``.

Nothing else: the analytics page is opt-in (``streamrecover.analytics.urls``), the run's
WebSocket route is in ``streamrecover.routing``, and the demo chat belongs to the demo project.
"""

from __future__ import annotations

from django.urls import path

from . import views_api

app_name = "streamrecover"

urlpatterns = [
    path("api/runs/", views_api.create_run, name="api-runs"),
    path("api/runs/<uuid:run_id>/", views_api.run_detail, name="api-run"),
    path("api/runs/<uuid:run_id>/cancel/", views_api.cancel_run, name="api-run-cancel"),
    path("api/threads/", views_api.thread_list, name="api-threads"),
    path("api/threads/<int:thread_id>/", views_api.thread_detail, name="api-thread"),
]
