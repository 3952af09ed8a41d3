"""A fault-injecting fake LLM provider (Anthropic Messages and OpenAI Chat Completions).

Deterministic answers, continuation exactly as real models behave, byte-exact faults
and a billing log: what recovery is tested against. Imports nothing from Django.
"""

from __future__ import annotations

from .faults import Fault, FaultKind, parse_script
from .log import LogEntry
from .server import DEFAULT_SCENARIO, SCENARIO_HEADER, FakeProviderServer

__all__ = [
    "DEFAULT_SCENARIO",
    "SCENARIO_HEADER",
    "FakeProviderServer",
    "Fault",
    "FaultKind",
    "LogEntry",
    "parse_script",
]
