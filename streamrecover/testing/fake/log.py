"""The fake provider's billing log: one entry per provider request.

An entry is there from the moment the request is accepted (status 0, nothing sent) and is
replaced as the answer goes on, each time before the client can see more of it; ``finished``
says the fake is done with the request (answered, cut, or the client hung up).

Tests read it to prove what the product paid for: a continuation must send the prefix as
input and bill only new output, never the same text twice. An output token is one content
delta carrying generated text (a text, thinking, tool-argument or refusal fragment); it is
billed when the bytes of its event were written completely, as on the real APIs. A
Responses background response is the exception: it is billed as the model generates it, read
or not, on the request that made it, whose entry goes on growing after ``finished`` until the
response ends or is cancelled (``background``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LogEntry:
    seq: int  # 1, 2, ... per server
    request_id: str  # the request-id / x-request-id header sent back
    method: str
    path: str
    provider: str  # "anthropic" | "openai"
    scenario: str  # the x-fake-scenario header, "default" without it
    headers: dict[str, str]  # request headers, secrets removed
    request: Any  # the request JSON (None when the body was not JSON)
    fault: dict[str, Any] | None  # Fault.to_dict() of the fault this request consumed
    fault_triggered: bool  # False when there was none or its position lay beyond the stream
    status: int  # 0 when the connection was dropped before any response
    bytes_sent: int  # response body bytes written (SSE bytes; chunk framing excluded)
    understood_as: str | None  # Mode value: fresh, prefill, prefix_flag, continue_message, new_turn_after_assistant
    prefix_chars: int  # characters of assistant text the request asked to continue from
    prefix_matched: bool | None  # None without a prefix; False when the model started over
    output_tokens: int  # content deltas of the whole planned response (the uninterrupted count)
    billed_output_tokens: int  # content deltas written completely before the fault
    billed_text: str  # the text of the billed text deltas, concatenated
    completed: bool  # the stream's terminator (message_stop / [DONE]) or the JSON body was written
    error: str | None  # the error message of a 4xx/5xx answer
    finished: bool  # False while the answer is still being written (or the fake still waits to write it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
