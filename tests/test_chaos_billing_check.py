"""The chaos harness's "no text billed twice" rule for text a killed worker had received but not
stored: billed again by the next claim, whether its first request or a retry of it got through."""

from __future__ import annotations

from typing import Any

from project.chaos.checks import CallAttempt, _after_a_lost_claim

RUN = "run-1"


def _entry(request_id: str, *, matched: bool = True) -> dict[str, Any]:
    return {"request_id": request_id, "prefix_matched": matched}


def _attempts(*rows: tuple[str, int, str, bool]) -> tuple[dict[str, CallAttempt], dict[str, list[int]]]:
    attempts = {request_id: CallAttempt(RUN, index, kind, ended) for request_id, index, kind, ended in rows}
    claimed = {RUN: [index for _, index, kind, _ in rows if kind == "resume"]}
    return attempts, claimed


def test_text_billed_again_by_a_retry_of_the_next_claims_first_request_is_a_kill_not_a_failure() -> None:
    # seed 115: a claim's answer completed, its worker was killed before the message was stored;
    # the next claim's resume got 529 twice, and its second retry billed the unstored tail again
    attempts, claimed = _attempts(
        ("req_a", 1, "resume", True), ("req_b", 2, "resume", True), ("req_c", 3, "pre_stream_retry", True),
        ("req_d", 4, "pre_stream_retry", True),
    )  # fmt: skip
    assert _after_a_lost_claim(_entry("req_a"), _entry("req_d"), attempts, claimed)
    assert _after_a_lost_claim(_entry("req_a"), _entry("req_b"), attempts, claimed)


def test_text_billed_again_within_one_claim_is_not_explained_by_a_kill() -> None:
    attempts, claimed = _attempts(
        ("req_a", 1, "resume", True), ("req_b", 2, "continuation", True), ("req_c", 3, "pre_stream_retry", True)
    )
    assert not _after_a_lost_claim(_entry("req_a"), _entry("req_c"), attempts, claimed)
    assert not _after_a_lost_claim(_entry("req_b"), _entry("req_c"), attempts, claimed)


def test_a_response_whose_attempt_never_ended_was_lost_with_its_worker() -> None:
    attempts, claimed = _attempts(("req_a", 0, "initial", False), ("req_b", 1, "continuation", True))
    assert _after_a_lost_claim(_entry("req_a"), _entry("req_b"), attempts, claimed)


def test_a_model_that_started_over_is_never_explained_by_a_kill() -> None:
    attempts, claimed = _attempts(("req_a", 0, "initial", False), ("req_b", 1, "resume", True))
    assert not _after_a_lost_claim(_entry("req_a"), _entry("req_b", matched=False), attempts, claimed)
