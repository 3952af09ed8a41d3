from __future__ import annotations

from django.apps import AppConfig


class StreamRecoverConfig(AppConfig):
    name = "streamrecover"
    verbose_name = "Stream recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Only registrations: system checks, the settings reload receiver, the rollup's delete receiver."""
        from django.core import checks
        from django.core.signals import setting_changed

        from .analytics.rollup import _unfold_deleted_run  # noqa: F401  (connects with @receiver)
        from .checks import ALL_CHECKS
        from .conf import reload_app_settings

        for check in ALL_CHECKS:
            checks.register(check, "streamrecover")
        setting_changed.connect(reload_app_settings, dispatch_uid="streamrecover.reload_app_settings")
