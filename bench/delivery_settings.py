"""The demo project in distributed mode for ``bench.bench_delivery``, with the coalescing
window taken from ``BENCH_FRAME_COALESCE_MS`` so the bench can compare windows."""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import STREAMRECOVER

STREAMRECOVER = {**STREAMRECOVER, "FRAME_COALESCE_MS": float(os.environ.get("BENCH_FRAME_COALESCE_MS", "25"))}
LOGGING["root"]["level"] = "ERROR"  # noqa: F405
LOGGING["loggers"]["streamrecover"]["level"] = "WARNING"  # noqa: F405
LOGGING["loggers"]["django_structlog"]["level"] = "WARNING"  # noqa: F405
