"""The error a cancelled run ends with, the same whoever ended it (its worker, or the cancel itself while queued)."""

from __future__ import annotations

from ..engine.cancel import StopKind

CANCELLED_BY_USER = "cancelled by user"  # the reason when none was given


def cancel_message(reason: str) -> str:
    """The message of a cancel asked for with ``reason`` (a worker's cancel token gets it)."""
    return reason or CANCELLED_BY_USER


def cancel_error(reason: str) -> dict[str, str]:
    """What a run cancelled with ``reason`` ends with, in its ``run_status`` frame, snapshots and
    row: the engine's ``{"kind": "cancel", "message": reason}`` (``engine.agent``), so that a
    client sees one end for a cancel whether or not a worker held the run."""
    return {"kind": StopKind.CANCEL.value, "message": cancel_message(reason)}
