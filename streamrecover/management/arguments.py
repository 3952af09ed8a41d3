"""``type=`` converters shared by the streamrecover commands.

A bad value is refused by argparse itself (a ``CommandError`` under ``call_command``, a usage
error on the command line) before a command's ``handle`` runs, so nothing is created for it.
The numeric rules are the settings' own (``conf.validate``): counts are non-negative integers,
durations and scales non-negative finite numbers.
"""

from __future__ import annotations

import argparse
import math
import uuid

from ..conf import MAX_STORED_INT


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a duration or a scale, 0 allowed)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number, not {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a wait that must be able to end with something done)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def non_negative_int(text: str) -> int:
    """An integer from 0 to what the database stores."""
    value = _integer(text)
    if not 0 <= value <= MAX_STORED_INT:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {MAX_STORED_INT}, not {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer from 1 to what the database stores."""
    value = _integer(text)
    if not 1 <= value <= MAX_STORED_INT:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_STORED_INT}, not {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 meaning any free one."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, not {text!r}")
    return value


def run_id(text: str) -> str:
    """A run's id: a UUID, in any of the spellings ``uuid.UUID`` reads."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id (a UUID): {text!r}") from None
