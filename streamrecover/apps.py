"""The app's configuration: its name, and the registrations ``ready()`` makes."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks

from .checks import ALL_CHECKS


class StreamRecoverConfig(AppConfig):
    name = "streamrecover"
    verbose_name = "Stream recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Only registrations: the system checks and the signal receivers."""
        from . import receivers  # imports models: not before the app registry is ready

        for check in ALL_CHECKS:
            checks.register(check, "streamrecover")
        receivers.connect()
