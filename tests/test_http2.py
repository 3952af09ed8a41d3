"""HTTP/2: the transport speaks it, the fake provider serves it (prior knowledge, h2c), and
a GOAWAY in the middle of a stream is a break like any other: classified ``goaway`` and
continued to exactly the uninterrupted answer."""

from __future__ import annotations

import httpx

from streamrecover.engine.transport import HttpxTransport

from .harness import assert_invariants, run

STORY = "Tell me a story [[words=80]]"


def h2c() -> HttpxTransport:
    return HttpxTransport(http2_prior_knowledge=True)


async def test_the_transport_offers_http2_by_default():
    async with HttpxTransport() as transport:
        pool = transport._client._transport._pool  # type: ignore[union-attr]
        assert pool._http2 is True
        assert pool._http1 is True  # and falls back to HTTP/1.1 where it is not offered


async def test_the_fake_answers_over_http2_like_over_http1(fake_server):
    before = fake_server.http2_connections
    over_h1 = await run(fake_server, STORY)
    async with h2c() as transport:
        over_h2 = await run(fake_server, STORY, transport=transport)
    assert fake_server.http2_connections > before
    assert_invariants(over_h2, over_h1)
    async with httpx.AsyncClient(http1=False, http2=True) as client:
        response = await client.post(f"{fake_server.base_url}/_fake/reset", json={"scenario": "none"})
    assert response.http_version == "HTTP/2"
    assert response.json() == {"reset": "none"}


async def test_goaway_mid_stream_is_classified_and_recovered(fake_server):
    for wire, model in (("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o")):
        reference = await run(fake_server, STORY, wire=wire, model=model)
        async with h2c() as transport:
            faults = ["goaway:events=12"]
            out = await run(fake_server, STORY, faults=faults, wire=wire, model=model, transport=transport)
        assert_invariants(out, reference)
        (interrupted,) = out.events("llm_stream_interrupted")
        assert interrupted["cause"] == "goaway", interrupted
        assert out.sink.attempts[0].interrupt_cause == "goaway"
        assert len(out.log) == 2  # the continuation went out on a new connection
        assert out.log[0].fault_triggered


async def test_goaway_at_every_boundary_over_http2(fake_server):
    reference = await run(fake_server, STORY)
    async with h2c() as transport:
        n = 1
        while True:
            out = await run(fake_server, STORY, faults=[f"goaway:events={n}"], transport=transport)
            try:
                assert_invariants(out, reference)
                causes = {e["cause"] for e in out.events("llm_stream_interrupted")}
                if out.log[0].completed:  # GOAWAY after the terminator: the answer was whole
                    assert causes == set(), causes
                    break
                assert causes == {"goaway"}, causes
            except AssertionError as exc:
                raise AssertionError(f"goaway:events={n}: {exc}") from exc
            n += 1
    assert n > 20
