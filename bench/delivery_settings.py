"""The demo project in distributed mode for ``bench.bench_delivery``: the coalescing window
from ``BENCH_FRAME_COALESCE_MS``, the channel layer from ``BENCH_LAYER`` (``core``: the core
channels_redis layer, for the per-token baseline), and the bench's probes when asked for."""

from __future__ import annotations

import os
import sys
import threading

from project.settings import *  # noqa: F403
from project.settings import CHANNEL_LAYERS, STREAMRECOVER

STREAMRECOVER = {
    **STREAMRECOVER,
    "FRAME_COALESCE_MS": float(os.environ.get("BENCH_FRAME_COALESCE_MS", "25")),
    "WORKER_MAX_RUNS": int(os.environ.get("BENCH_WORKER_MAX_RUNS", "100")),
}
if os.environ.get("BENCH_LAYER") == "core":
    CHANNEL_LAYERS = {"default": {**CHANNEL_LAYERS["default"], "BACKEND": "channels_redis.core.RedisChannelLayer"}}
LOGGING["root"]["level"] = "ERROR"  # noqa: F405
# BENCH_LOG_LEVEL=INFO: the app's own log lines too (a client caught up, a run's end...).
LOGGING["loggers"]["streamrecover"]["level"] = os.environ.get("BENCH_LOG_LEVEL", "WARNING")  # noqa: F405
LOGGING["loggers"]["django_structlog"]["level"] = "WARNING"  # noqa: F405

# BENCH_PROFILE=<file>: sample every thread of this process (bench.sampler) into that file.
if os.environ.get("BENCH_PROFILE"):
    from bench.sampler import start_from_env

    start_from_env()

# BENCH_COUNTS=<file>: count this process's checkpoint writes into that file (bench.counters).
if os.environ.get("BENCH_COUNTS"):
    from bench.counters import install

    install(os.environ["BENCH_COUNTS"])

# BENCH_CPROFILE=<file>: cProfile the worker's shared run loop into that file (bench.counters).
if os.environ.get("BENCH_CPROFILE"):
    from bench.counters import profile_run_loop

    profile_run_loop(os.environ["BENCH_CPROFILE"])

# BENCH_DAPHNE_CPROFILE=<file>: cProfile Daphne's main thread (its reactor loop) into that file.
if os.environ.get("BENCH_DAPHNE_CPROFILE") and threading.current_thread() is threading.main_thread():
    from bench.counters import profile_main_thread

    profile_main_thread(os.environ["BENCH_DAPHNE_CPROFILE"])

# BENCH_TRACEMALLOC=<file>: what holds this worker's memory at its peak (bench.counters).
if os.environ.get("BENCH_TRACEMALLOC"):
    from bench.counters import trace_memory

    trace_memory(os.environ["BENCH_TRACEMALLOC"])

# BENCH_MEMPROBE=<file>: where a worker's memory per stream goes (bench.memprobe).
if os.environ.get("BENCH_MEMPROBE") and "worker" in sys.argv:
    from bench.memprobe import install as install_memprobe

    install_memprobe(os.environ["BENCH_MEMPROBE"])
