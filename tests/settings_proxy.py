"""Settings of a Daphne subprocess serving the healing endpoint (``tests/test_proxy_resume.py``):
the test settings, both wire formats served by the built-in fake, a checkpoint at every delta."""

from __future__ import annotations

from .settings import *  # noqa: F403
from .settings import STREAMRECOVER

STREAMRECOVER = {
    **STREAMRECOVER,
    "PROXY_ANTHROPIC_PROVIDER": "fake",
    "PROXY_OPENAI_PROVIDER": "fake",
    "CHECKPOINT_EVERY_DELTAS": 1,
}
