"""The engine's knobs as one value type (``EngineConfig``).

Django reads them from ``STREAMRECOVER`` settings; the engine itself only ever sees this dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_continuations: int = 5  # continuation attempts per assistant turn
    backoff_schedule: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)  # seconds before continuation n
    backoff_scale: float = 1.0  # multiplies the schedule (tests and demos shrink it)
    backoff_jitter: float = 0.0  # 0..1: a random downward share of each wait
    max_retry_after_s: float = 60.0  # cap on a provider's Retry-After
    max_request_retries: int = 2  # pre-stream retries per HTTP call (their own budget)
    request_retry_base_s: float = 0.5  # pre-stream retry backoff: base * 2**n, capped at 8 s, scaled
    idle_timeout_s: float = 60.0  # no byte for this long after the stream started: idle stall
    connect_timeout_s: float = 10.0
    checkpoint_ttl_s: float = 3600.0  # older checkpoints are ignored on resume
    checkpoint_every_deltas: int = 64
    checkpoint_every_bytes: int = 16_384
    checkpoint_every_seconds: float = 1.0
    notify_model_of_discarded_tools: bool = False
    max_turns: int = 8  # agent loop: assistant turns per run
    max_line_bytes: int = 1_048_576  # SSE line (and event data) bound
    max_stream_seconds: float = 1800.0  # one response's stream, however lively, ends by then
