"""The app's WebSocket routes; ``project/asgi.py`` mounts them behind ``AuthMiddlewareStack``."""

from __future__ import annotations

from django.urls import path

from .live.consumer import RunConsumer
from .live.threads import ThreadConsumer

websocket_urlpatterns = [
    path("ws/streamrecover/runs/<uuid:run_id>/", RunConsumer.as_asgi(), name="streamrecover-run-socket"),
    path("ws/streamrecover/threads/<int:thread_id>/", ThreadConsumer.as_asgi(), name="streamrecover-thread-socket"),
]
