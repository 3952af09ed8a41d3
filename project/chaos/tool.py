"""The harness's tool: the demo's ``get_weather``, recording every execution in a log the checks read.

Installed in every stack process by the chaos settings: ``demo_registry`` looks the function
up in ``streamrecover.testing.tools`` when it builds a run's tools, so runs started with
``demo_tools`` call this one. Each execution appends one JSON line (the run id from the
log context the worker binds while it executes the run, the arguments, the process, the
time) with ``O_APPEND``, so lines of concurrent processes never interleave; a second line
for one run's call is a tool executed twice. ``block`` seconds of sleep make the tool slow
enough to outlast the stale-heartbeat window, as a real slow tool would.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import structlog

from streamrecover.testing import tools


def install_recording_tool(log_path: str | None, block: float = 0.0) -> None:
    if not log_path:
        return
    original = tools.get_weather
    if getattr(original, "chaos_recording", False):
        return

    def get_weather(args: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        if block > 0:
            time.sleep(block)
        context = structlog.contextvars.get_contextvars()
        line = {
            "run_id": context.get("run_id"),
            "args": args,
            "pid": os.getpid(),
            "pgid": os.getpgrp(),  # the worker's process group: what the harness kills
            "started": started,
            "ended": time.time(),
        }
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
        return original(args)

    get_weather.chaos_recording = True  # type: ignore[attr-defined]
    tools.get_weather = get_weather
