"""The token logprobs of a continuation's text at the seam: an entry goes on only where its token
is exactly the text the client is shown there."""

from __future__ import annotations

from streamrecover.engine.events import TokenLogprob
from streamrecover.engine.join import ContinuationJoiner
from streamrecover.engine.seamlogprobs import SeamLogprobs


def entry(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-0.25, bytes=list(token.encode()), top_logprobs=[])


def joined(
    kept: str, deltas: list[tuple[str, tuple[TokenLogprob, ...]]], joiner: ContinuationJoiner | None = None
) -> tuple[str, list[TokenLogprob]]:
    """What a client is shown after ``kept`` (a continue-message seam unless ``joiner`` says
    otherwise), and the entries passed with it."""
    joiner, seam = joiner or ContinuationJoiner(overlap_with=kept), SeamLogprobs()
    shown, passed = "", []
    for text, logprobs in deltas:
        seam.fed(text, logprobs)
        released = joiner.feed(text)
        passed += seam.released(released, decided=joiner.decided)
        shown += released
    released = joiner.flush()
    passed += seam.released(released, decided=joiner.decided)
    return shown + released, passed


def test_a_token_the_trim_cut_in_two_is_dropped_and_the_tokens_after_it_kept() -> None:
    kept = "The river runs to the sea"
    # the continuation repeats "the sea": the trim ends inside the delta "a and", between its tokens
    text, passed = joined(
        kept, [("the se", (entry("the se"),)), ("a and", (entry("a"), entry(" and"))), (" on", (entry(" on"),))]
    )
    assert text == " and on"
    assert passed == [entry(" and"), entry(" on")]  # "the se" and "a" were trimmed


def test_a_delta_whose_tokens_do_not_spell_it_loses_them_all_where_the_trim_cuts_it() -> None:
    kept = "The river runs to the sea"
    bytes_token = TokenLogprob(token="bytes:\\xe6", logprob=-1.0, bytes=[230], top_logprobs=[])
    text, passed = joined(kept, [("the sea 日", (entry("the sea "), bytes_token)), ("!", (entry("!"),))])
    assert text == " 日!"
    assert passed == [entry("!")]


def test_a_clean_seam_passes_every_entry() -> None:
    text, passed = joined("The river runs", [(" to", (entry(" to"),)), (" the", (entry(" the"),))])
    assert text == " to the"
    assert passed == [entry(" to"), entry(" the")]


def test_a_token_whose_leading_space_a_prefill_had_shown_already_is_dropped() -> None:
    """The prefill left the kept text's trailing space out; the continuation wrote it again in " And",
    and the client is shown "And" only: no entry says " And" is there."""
    text, passed = joined(
        "The river ", [(" And", (entry(" And"),)), (" on", (entry(" on"),))], ContinuationJoiner(expect=" ")
    )
    assert text == "And on"
    assert passed == [entry(" on")]
