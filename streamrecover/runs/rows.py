"""Database rows from the engine's records: values as plain JSON, and attempts' rows."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ..engine.sink import AttemptRecord
from ..models import Attempt
from ..redaction import redact, redact_request


def jsonable(value: Any) -> Any:
    """Plain JSON types only, so a log line and a JSON column hold the very same thing."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


def attempt_values(attempt: AttemptRecord) -> dict[str, Any]:
    """``attempt``'s row but its key (run, index): what its upsert sets. The request is stored
    as sent, with the app's secrets cut out."""
    usage = attempt.usage
    return {
        "turn": attempt.turn,
        "kind": attempt.kind,
        "continuation": attempt.continuation,
        "strategy": attempt.strategy or "",
        "status_code": attempt.status_code,
        "provider_request_id": attempt.request_id or "",
        "started_at": _dt(attempt.started_at),
        "first_byte_at": _dt(attempt.first_byte_at),
        "ended_at": _dt(attempt.ended_at),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "usage_estimated": attempt.usage_estimated,
        "bytes_received": attempt.bytes_received,
        "interrupt_cause": str(attempt.interrupt_cause or ""),
        "error_kind": str(attempt.error_kind or ""),
        "error_message": redact(attempt.error_message or ""),
        "stop_reason": str(attempt.stop_reason or ""),
        "outcome": str(attempt.outcome),
        "request": redact_request(jsonable(attempt.request)),
    }


def upsert_attempts(rows: Iterable[tuple[str | uuid.UUID, AttemptRecord]]) -> None:
    """One ``INSERT ... ON CONFLICT (run, index) DO UPDATE`` for the attempts of ``rows`` (run id,
    attempt): an attempt's start and its end are one statement each, never a locking read."""
    values = [(run_id, attempt.index, attempt_values(attempt)) for run_id, attempt in rows]
    if not values:
        return
    Attempt.objects.bulk_create(
        [Attempt(run_id=run_id, index=index, **fields) for run_id, index, fields in values],
        update_conflicts=True,
        unique_fields=["run", "index"],
        update_fields=list(values[0][2]),
    )
