"""The app's WebSocket routes; ``project/asgi.py`` mounts them behind ``AuthMiddlewareStack``."""

from __future__ import annotations

from django.urls import path

from .live.consumer import RunConsumer

websocket_urlpatterns = [
    path("ws/streamrecover/runs/<uuid:run_id>/", RunConsumer.as_asgi(), name="streamrecover-run-socket"),
]
