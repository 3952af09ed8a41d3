"""The chat page's recovery notice after a reload (``chat/notice.py``): what the live page was left
saying when the run ended, for every way a run ends, read from the run's stored events."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from streamrecover.chat.notice import RecoveryNotice, recovery_notice
from streamrecover.models import Run

from .factories import make_event, make_run

pytestmark = pytest.mark.django_db(transaction=True)

RECOVERED = RecoveryNotice("recovered")
RESTARTED = RecoveryNotice("recovered", restarted=True)

# The events the engine stores, with the fields the notice reads (the rest left out).
BREAK = ("llm_stream_interrupted", {"plan": "continue_text", "kept_text_chars": 600})
CONTINUING = ("llm_stream_continuation_started", {"plan": "continue_text", "committed": {"text_chars": 600}})
RESTARTING = ("llm_stream_continuation_started", {"plan": "whole_restart", "committed": {"text_chars": 0}})
DONE = ("llm_stream_continuation_completed", {"completion_reason": "end_turn"})
# the continuation sent text, then broke again
BREAK_AFTER_MORE = ("llm_stream_interrupted", {"plan": "continue_text", "kept_text_chars": 900})
# the continuation's request was refused before it streamed (after its own retries)
REFUSED = ("llm_stream_continuation_failed", {"error_kind": "server_error"})
PREFILL_REFUSED = ("llm_stream_continuation_failed", {"error_kind": "prefill_refused", "fallback_strategy": "x"})


def ended(status: str, *events: tuple[str, dict[str, Any]]) -> Run:
    """A run that ended with ``status`` after ``events``, stored in that order."""
    run = make_run(status=status)
    start = timezone.now()
    for i, (name, payload) in enumerate(events):
        make_event(run, name, payload=payload, created=start + timedelta(milliseconds=i))
    return run


# ---- what a live page showed, from the frames (chat.js's rules) ------------------------------------


def live_notice(frames: Iterable[Mapping[str, Any]]) -> RecoveryNotice | None:
    """``#sr-recovery`` once the run has ended, as ``chat.js`` leaves it: the last ``continuing``
    frame says "Recovered" once a delta follows it, an ``exhausted`` one "Gave up", anything else
    is hidden at the end."""
    phase, last = None, {}
    for frame in frames:
        if frame["type"] == "recovery":
            phase, last = frame["phase"], frame
        elif phase == "continuing" and frame["type"].endswith("_delta"):
            phase = "recovered"
    if phase == "recovered":
        return RecoveryNotice("recovered", restarted=last["plan"] == "whole_restart")
    if phase == "exhausted":
        return RecoveryNotice("exhausted", continuations=last["attempt"], plan=last["plan"])
    return None


# ---- each end, from the stored events --------------------------------------------------------------


def test_a_completed_run_says_recovered_once_its_continuation_went_on() -> None:
    assert recovery_notice(ended("completed")) is None
    assert recovery_notice(ended("completed", BREAK, CONTINUING, DONE)) == RECOVERED
    assert recovery_notice(ended("completed", RESTARTING, DONE)) == RESTARTED
    # the continuation broke before it sent anything and the turn ended there (its budget spent):
    # live, "continuing" never became "Recovered" (no delta came) and was hidden at the end
    assert recovery_notice(ended("completed", BREAK, CONTINUING, BREAK)) is None


def test_a_cancelled_run_says_recovered_unless_it_was_cancelled_waiting_to_continue_again() -> None:
    """Live the page kept "Recovered…" when a recovered run was cancelled afterwards; after a reload
    it said nothing (only a completed run's notice was read)."""
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING, DONE)) == RECOVERED  # in a later turn
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING)) == RECOVERED  # during the continuation
    assert recovery_notice(ended("cancelled", RESTARTING, DONE)) == RESTARTED
    # a refused prefill is no break: the same continuation goes on, with no new frame
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING, PREFILL_REFUSED)) == RECOVERED
    # broke again and cancelled in the backoff: the page said "reconnecting…", then hid it at the end
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING, DONE, BREAK)) is None
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING, BREAK_AFTER_MORE)) is None
    assert recovery_notice(ended("cancelled", BREAK, CONTINUING, REFUSED)) is None
    assert recovery_notice(ended("cancelled", BREAK)) is None


def test_a_failed_run_says_recovered_when_its_continuation_went_on_before_the_end() -> None:
    """Live "Recovered…" stayed when the run failed after its continuation had streamed (no recovery
    frame came after); after a reload the page said nothing."""
    assert recovery_notice(ended("failed", BREAK, CONTINUING, DONE)) == RECOVERED  # in a later turn
    assert recovery_notice(ended("failed", BREAK, CONTINUING, BREAK_AFTER_MORE)) == RECOVERED
    assert recovery_notice(ended("failed", RESTARTING, DONE)) == RESTARTED
    # live, "continuing" became "Recovered" only with a delta after it: none came
    assert recovery_notice(ended("failed", BREAK, CONTINUING, REFUSED)) is None
    assert recovery_notice(ended("failed", BREAK, CONTINUING, BREAK)) is None
    assert recovery_notice(ended("failed", BREAK)) is None


def test_an_exhausted_run_names_the_plan_its_exhausted_event_names() -> None:
    """The plan of the last break is not the one given up on when the continuations were refused
    before they streamed: the exhausted frame names the plan of the blocks kept."""
    run = ended(
        "exhausted",
        ("llm_stream_interrupted", {"plan": "truncate_before_tool", "kept_text_chars": 33}),
        ("llm_stream_continuation_started", {"plan": "truncate_before_tool", "committed": {"text_chars": 33}}),
        REFUSED,
        ("llm_stream_continuation_exhausted", {"attempts": 1, "plan": "continue_text"}),
    )
    assert recovery_notice(run) == RecoveryNotice("exhausted", continuations=1, plan="continue_text")


# ---- the same, from runs of the fake provider: the reload says what the frames said -----------------

R3 = "[[text=Let me check the weather for you.]] [[tool=get_weather]]"


@pytest.mark.parametrize(
    ("prompt", "faults", "options", "status", "notice"),
    [
        pytest.param(
            "Tell me about rivers. [[words=150]]",
            ["cut:bytes=1500", "error:events=15,type=invalid_request_error"],
            {},
            "failed",
            RECOVERED,
            id="recovered-then-failed",
        ),
        pytest.param(
            R3,
            ["cut:events=15", *["status:503"] * 6],
            {"engine": {"max_continuations": 2}, "demo_tools": True},
            "exhausted",
            RecoveryNotice("exhausted", continuations=2, plan="continue_text"),
            id="exhausted-after-refused-continuations",
        ),
    ],
)
def test_after_a_reload_the_notice_is_the_one_the_live_frames_left(
    streamrecover_fake: Any,
    prompt: str,
    faults: list[str],
    options: dict[str, Any],
    status: str,
    notice: RecoveryNotice | None,
) -> None:
    report = streamrecover_fake.run(prompt, faults=faults, **options)
    assert report.status == status
    assert live_notice(report.frames) == notice
    assert recovery_notice(Run.objects.get(pk=report.run_id)) == notice
