from __future__ import annotations

from django.apps import AppConfig


class StreamRecoverConfig(AppConfig):
    name = "streamrecover"
    verbose_name = "Stream recovery"
    default_auto_field = "django.db.models.BigAutoField"
