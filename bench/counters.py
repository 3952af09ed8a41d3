"""Counts of a worker's checkpoint writes, written to a file every second (``BENCH_COUNTS``).

The engine's ``CheckpointWriter.write`` is wrapped in the worker process only (by
``bench.delivery_settings``); the bench reads the files after the run.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

COUNTS: dict[str, int] = {"checkpoint_writes": 0}


def install(target: str) -> None:
    from streamrecover.engine.checkpoint import CheckpointWriter

    original = CheckpointWriter.write

    @functools.wraps(original)
    async def write(self: Any, checkpoint: Any) -> None:
        COUNTS["checkpoint_writes"] += 1
        await original(self, checkpoint)

    CheckpointWriter.write = write  # type: ignore[method-assign]
    out = Path(target.replace("{pid}", str(os.getpid())))

    def dump() -> None:
        while True:
            time.sleep(1.0)
            out.write_text(json.dumps(COUNTS))

    threading.Thread(target=dump, name="bench-counters", daemon=True).start()
