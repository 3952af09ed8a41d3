"""The demo chat app's configuration."""

from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "project.demo"
    label = "demo"
    verbose_name = "streamrecover demo"
