"""The demo's Celery app: configured from Django settings (``CELERY_`` namespace), with
django-structlog's boot step so task logs carry the request's context."""

from __future__ import annotations

import os

from celery import Celery
from django_structlog.celery.steps import DjangoStructLogInitStep

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("streamrecover_demo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.steps["worker"].add(DjangoStructLogInitStep)
app.autodiscover_tasks()
