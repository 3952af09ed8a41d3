"""No output token is paid twice: an answer cut anywhere and continued by a prefill costs
exactly the uninterrupted answer's output tokens, also where the cut fell behind a delta that
ended in a space, which a prefill must leave out (the provider writes it again with the word
after it, as one token). Real HTTP against the fake provider, whose log is the bill."""

from __future__ import annotations

from .harness import assert_invariants, run

STORY = "Tell me a long story about the sea [[words=300]]"
POINTS = 9


async def test_a_prefill_continuation_bills_every_output_token_once_wherever_the_cut(fake_server):
    reference = await run(fake_server, STORY)
    total_bytes = reference.log[0].bytes_sent
    paid_once = reference.log[0].billed_output_tokens
    whitespace_left_out = 0
    for i in range(1, POINTS + 1):
        out = await run(fake_server, STORY, faults=[f"cut:bytes={total_bytes * i // (POINTS + 1)}"])
        assert_invariants(out, reference)
        first, second = out.log[0], out.log[1]
        assert second.understood_as == "prefill"
        whitespace_left_out += second.prefix_chars < len(first.billed_text)
        assert sum(e.billed_output_tokens for e in out.log) == paid_once, f"cut {i}/{POINTS + 1}"
    assert whitespace_left_out  # the case the test is about did occur
