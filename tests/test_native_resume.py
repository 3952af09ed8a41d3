"""Native resume on the OpenAI Responses fake: a broken background response is re-attached
with ``starting_after`` and goes on, nothing generated or billed again; when the response is
gone the break is continued the ordinary way."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from streamrecover.engine.cancel import CancelToken
from streamrecover.engine.checkpoint import Checkpoint, InMemoryCheckpointStore
from streamrecover.engine.errors import ClaimLost
from streamrecover.engine.sink import CollectingSink, StructuredEvent
from streamrecover.engine.sse import SSEDecoder
from streamrecover.testing.tools import demo_registry

from .harness import assert_invariants, run, with_config

TEXT = "A story [[words=20]]"
TOOL = "Weather? [[words=8]] [[tool=get_weather]]"
NATIVE = {"native_resume": True}


async def once(server, prompt, faults=(), **kw):
    return await run(
        server,
        prompt,
        faults=list(faults),
        wire="openai-responses",
        model="gpt-4o",
        tools=demo_registry(),
        provider_kw=NATIVE,
        **kw,
    )


def requests(outcome) -> list[tuple[str, str | None]]:
    """The requests the provider saw, in order, but for a cancel of an abandoned response: it runs
    beside the recovery (the next request does not wait for it), so it comes last here."""
    seen = [(e.method, e.understood_as) for e in outcome.log]
    return [r for r in seen if r[1] != "cancel"] + [r for r in seen if r[1] == "cancel"]


def entry(outcome, understood_as):
    (found,) = [e for e in outcome.log if e.understood_as == understood_as]
    return found


def billed_tokens(outcome) -> int:
    return sum(e.billed_output_tokens for e in outcome.log)


def event_count(server, reference) -> int:
    import httpx

    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers["authorization"] = "Bearer k"
    raw = httpx.post(request["url"], json=request["json"], headers=headers).content
    return len(SSEDecoder().feed(raw))


@pytest.mark.parametrize("prompt", [TEXT, TOOL])
async def test_every_break_is_resumed_in_the_same_response(fake_server, prompt):
    """At every event boundary: the committed answer is the uninterrupted one, the re-attach
    asks for the events after the last one kept, and the fake billed one generation."""
    reference = await once(fake_server, prompt)
    assert_invariants(reference)
    assert reference.log[0].request["background"] is True
    whole = billed_tokens(reference)
    resumed = 0
    for n in range(1, event_count(fake_server, reference)):
        outcome = await once(fake_server, prompt, [f"cut:events={n}"])
        try:
            assert_invariants(outcome, reference)
            assert billed_tokens(outcome) == whole, "billed twice"
            kinds = [a.kind for a in outcome.sink.attempts]
            if len(outcome.log) > 1 and outcome.log[1].method == "GET":
                resumed += 1
                assert kinds[:2] == ["initial", "native_resume"]
                assert outcome.sink.attempts[1].strategy == "native_resume"
                after = int(outcome.sink.attempts[1].request["url"].rsplit("=", 1)[1])
                assert 0 <= after < n
                (interrupted,) = outcome.events("llm_stream_interrupted")
                assert interrupted["plan"] == "native_resume"
                assert outcome.events("llm_stream_continuation_started")[0]["strategy"] == "native_resume"
                # the attempts' usage adds up to one answer
                usage = [a.usage.output_tokens for a in outcome.sink.attempts[:2]]
                assert sum(u or 0 for u in usage) == reference.sink.attempts[0].usage.output_tokens
        except AssertionError as exc:
            raise AssertionError(f"cut:events={n}: {exc}") from exc
    assert resumed > 5


async def test_a_gone_response_falls_back_to_a_continuation(fake_server):
    reference = await once(fake_server, TEXT)
    outcome = await once(fake_server, TEXT, ["cut:events=12", "status:404"])
    assert_invariants(outcome, reference)
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "native_resume", "continuation"]
    (failed,) = outcome.events("llm_stream_continuation_failed")
    assert failed["fallback_strategy"] == "continue_message"
    assert outcome.log[2].understood_as == "continue_message"


async def test_without_the_setting_a_break_is_continued(fake_server):
    outcome = await run(fake_server, TEXT, faults=["cut:events=12"], wire="openai-responses", model="gpt-4o")
    assert "background" not in outcome.log[0].request
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "continuation"]


async def fail_over(server, prompt, faults, **kw):
    """A re-attached response that breaks again spends the one continuation: the turn fails
    over to a Chat Completions provider (the same fake)."""
    config = kw.pop("config", with_config(max_continuations=1))
    return await once(server, prompt, faults, config=config, failover=("openai", "gpt-4o"), **kw)


async def test_a_spent_budget_fails_over_to_a_continuation_not_a_reattach(fake_server):
    """The resume point is the first provider's: the fallback continues the kept text the
    ordinary way (it crashed trying to re-attach there), and the answer is the uninterrupted one."""
    reference = await once(fake_server, TEXT)
    outcome = await fail_over(fake_server, TEXT, ["cut:events=12", "cut:events=6"])
    assert_invariants(outcome, reference)  # completed, streamed == stored == the reference, byte for byte
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "native_resume", "continuation"]
    assert requests(outcome) == [
        ("POST", "fresh"),
        ("GET", "resume"),
        ("POST", "continue_message"),
        ("POST", "cancel"),  # the response left behind (here it had ended: nothing to stop)
    ]
    assert entry(outcome, "continue_message").path == "/v1/chat/completions"
    (failover,) = outcome.events("llm_stream_failover")
    assert (failover["reason"], failover["from_provider"], failover["to_provider"], failover["plan"]) == (
        "exhausted",
        "openai-responses",
        "fake-openai",
        "native_resume",
    )
    started = outcome.events("llm_stream_continuation_started")
    assert [(e["strategy"], e["plan"]) for e in started] == [
        ("native_resume", "native_resume"),
        ("continue_message", "continue_text"),
    ]
    assert outcome.events("llm_stream_continuation_completed")
    # the re-attach billed nothing, and the fallback only the rest of the answer: not the text shown
    text = reference.assistant[0]["content"][0]["text"]
    kept = started[-1]["committed"]["text_chars"]
    assert 0 < kept < len(text)
    assert outcome.log[1].billed_output_tokens == 0
    assert entry(outcome, "continue_message").billed_text == text[kept:]


async def test_a_structured_answer_fails_over_as_a_restart(fake_server):
    """A fallback that can only continue with a continue message would break the JSON: it starts over."""
    reference = await once(fake_server, TEXT, structured=True)
    outcome = await fail_over(fake_server, TEXT, ["cut:events=12", "cut:events=6"], structured=True)
    assert_invariants(outcome, reference)
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "native_resume", "restart"]
    assert [r[1] for r in requests(outcome)][2:] == ["fresh", "cancel"]
    assert outcome.events("llm_stream_continuation_started")[-1]["plan"] == "whole_restart"
    assert len(outcome.frames("stream_reset")) == 1


async def test_a_tool_call_cut_off_when_failing_over_is_lost_not_resent(fake_server):
    """The native plan dropped the half call as one the re-attach sends again; the fallback
    will not: it is a discarded call the model is told about, as at any other break."""
    reference = await once(fake_server, TOOL)
    config = with_config(max_continuations=1, notify_model_of_discarded_tools=True)
    outcome = await fail_over(fake_server, TOOL, ["cut:events=22", "cut:events=2"], config=config)
    assert outcome.status == "completed", outcome.result.error
    assert [a.kind for a in outcome.sink.attempts][:3] == ["initial", "native_resume", "continuation"]
    assert outcome.assistant[0] == reference.assistant[0]  # the fallback wrote the call again, whole
    assert [f["reason"] for f in outcome.frames("tool_call_cancel")] == ["partial", "partial"]
    notices = [b for b in outcome.result.messages[2]["content"] if b["type"] == "text"]
    assert len(notices) == 1
    assert "was not executed" in notices[0]["text"]


async def test_a_checkpoint_whose_response_is_gone_is_continued(fake_server):
    """Another worker picks up a checkpoint whose background response expired: the re-attach
    gets a 404 and the checkpoint's blocks are continued instead, without spending the budget."""
    reference = await once(fake_server, TEXT)
    text = reference.assistant[0]["content"][0]["text"]
    store = InMemoryCheckpointStore()
    native = {"response_id": "resp_expired", "after": 14, "open_text": True}
    blocks = [{"type": "text", "text": text[:30]}]
    await store.put(Checkpoint(run_id="native-1", turn=0, history_len=1, blocks=blocks, native=native))
    out = await once(
        fake_server, TEXT, checkpoints=store, run_id="native-1", resume=True, config=with_config(max_continuations=0)
    )
    assert_invariants(out, reference)
    assert [a.kind for a in out.sink.attempts] == ["native_resume", "continuation"]
    assert out.sink.attempts[0].status_code == 404
    assert out.events("llm_run_resumed")[0]["plan"] == "native_resume"
    assert out.log[1].understood_as == "continue_message"


async def test_an_error_event_is_continued_not_reattached(fake_server):
    """A response that sent an error has failed: re-attaching would replay the error."""
    reference = await once(fake_server, TEXT)
    outcome = await once(fake_server, TEXT, ["error:events=12"])
    assert_invariants(outcome, reference)
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "continuation"]


async def test_a_cancelled_run_cancels_its_background_response(fake_server):
    """Nobody would read the rest: the response is stopped (``POST .../responses/{id}/cancel``)."""
    cancel = CancelToken()

    async def cancel_soon():
        await asyncio.sleep(0.5)
        cancel.cancel()

    task = asyncio.ensure_future(cancel_soon())
    outcome = await once(fake_server, TEXT, ["stall:events=12,seconds=5"], cancel=cancel)
    await task
    assert outcome.status == "cancelled"
    # (the stalled request's own log entry is written when its stall ends)
    (stop,) = [e for e in outcome.log if e.understood_as == "cancel"]
    assert (stop.method, stop.status) == ("POST", 200)
    assert stop.path.startswith("/v1/responses/resp_")
    assert stop.path.endswith("/cancel")


STORY = "A long story [[words=40]]"
PACE = 0.03  # seconds per event: the model is still writing when the turn leaves its response


@pytest.fixture(scope="module")
def paced_server():
    """A fake whose model takes time: a background response left behind is still being generated."""
    from streamrecover.testing.fake import FakeProviderServer

    with FakeProviderServer(event_delay=PACE) as server:
        yield server


async def test_a_failover_cancels_the_response_left_behind(fake_server, paced_server):
    """The fallback writes the rest: the first provider's response, which would go on being
    generated and billed for nobody, is cancelled, and billed only up to the cancel (at least
    what the client was sent of it, less than the whole answer)."""
    reference = await once(fake_server, STORY)
    whole = reference.log[0].billed_output_tokens
    events = event_count(fake_server, reference)
    started = time.monotonic()
    outcome = await fail_over(paced_server, STORY, ["cut:events=12", "cut:events=6"])
    assert_invariants(outcome, reference)
    assert requests(outcome) == [
        ("POST", "fresh"),
        ("GET", "resume"),
        ("POST", "continue_message"),
        ("POST", "cancel"),
    ]
    stop = entry(outcome, "cancel")
    assert (stop.status, stop.billed_output_tokens) == (200, 0)
    assert stop.path == outcome.log[1].path + "/cancel"  # the response re-attached to
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert (abandoned["reason"], abandoned["cancelled"], abandoned["response_status"], abandoned["error"]) == (
        "failover",
        True,
        "cancelled",
        None,
    )
    # By now the model would have written the whole answer: the cancelled one's billing stopped.
    await asyncio.sleep(max(0.0, started + (events + 10) * PACE - time.monotonic()))
    (made,) = [e for e in paced_server.log_for(stop.scenario) if e.understood_as == "fresh"]
    text = reference.assistant[0]["content"][0]["text"]
    kept = outcome.events("llm_stream_continuation_started")[-1]["committed"]["text_chars"]
    assert text.startswith(made.billed_text)
    assert kept <= len(made.billed_text) < len(text)
    assert made.billed_output_tokens < whole


async def test_a_failed_reattach_cancels_the_response(fake_server):
    """The re-attach is refused before its stream starts: the break is continued instead, and
    the response, which nobody will read, is cancelled."""
    outcome = await once(fake_server, TEXT, ["cut:events=12", "status:400"])
    assert outcome.status == "completed", outcome.result.error
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "native_resume", "continuation"]
    assert requests(outcome) == [
        ("POST", "fresh"),
        ("GET", None),
        ("POST", "continue_message"),
        ("POST", "cancel"),
    ]
    (abandoned,) = outcome.events("llm_response_abandoned")
    # this fake writes a response at once: it had ended, and is answered as it is, billed whole
    assert (abandoned["reason"], abandoned["cancelled"], abandoned["response_status"]) == (
        "reattach_failed",
        False,
        "completed",
    )


async def test_a_gone_response_is_not_cancelled(fake_server):
    """A 404: there is nothing left to stop."""
    outcome = await once(fake_server, TEXT, ["cut:events=12", "status:404"])
    assert [e.understood_as for e in outcome.log] == ["fresh", None, "continue_message"]
    assert not outcome.events("llm_response_abandoned")


async def test_a_call_cut_off_before_a_failed_reattach_is_reported_once(fake_server):
    """The call cut off at the break was dropped for the re-attach to send again; the re-attach is
    refused, and the continuation writes the call anew: the model is told, once, that the cut
    one was not executed."""
    reference = await once(fake_server, TOOL)
    config = with_config(notify_model_of_discarded_tools=True)
    outcome = await once(fake_server, TOOL, ["cut:events=22", "status:400"], config=config)
    assert outcome.status == "completed", outcome.result.error
    assert [a.kind for a in outcome.sink.attempts][:3] == ["initial", "native_resume", "continuation"]
    assert outcome.assistant[0] == reference.assistant[0]  # the continuation wrote the call again, whole
    assert [f["reason"] for f in outcome.frames("tool_call_cancel")] == ["partial"]
    notices = [b for b in outcome.result.messages[2]["content"] if b["type"] == "text"]
    assert len(notices) == 1
    assert "was not executed" in notices[0]["text"]


async def test_a_cut_call_not_sent_again_before_a_failover_is_reported_once(fake_server):
    """The call cut off at the first break is dropped to be sent again; the re-attach breaks
    before it is, and the turn fails over: the model is told once that it was not executed."""
    config = with_config(max_continuations=1, notify_model_of_discarded_tools=True)
    outcome = await fail_over(fake_server, TOOL, ["cut:events=22", "cut:events=0"], config=config)
    assert outcome.status == "completed", outcome.result.error
    assert [a.kind for a in outcome.sink.attempts][:3] == ["initial", "native_resume", "continuation"]
    assert [f["reason"] for f in outcome.frames("tool_call_cancel")] == ["partial"]
    notices = [b for b in outcome.result.messages[2]["content"] if b["type"] == "text"]
    assert len(notices) == 1
    assert "was not executed" in notices[0]["text"]


async def test_an_exhausted_turn_cancels_the_response_it_leaves(fake_server, paced_server):
    """No continuation is left, and no fallback: the turn ends exhausted with the text shown,
    and the response broken off, which nobody will read, is cancelled (billed up to the cancel)."""
    reference = await once(fake_server, STORY)
    whole = reference.log[0].billed_output_tokens
    events = event_count(fake_server, reference)
    started = time.monotonic()
    outcome = await once(paced_server, STORY, ["cut:events=12"], config=with_config(max_continuations=0))
    assert outcome.status == "exhausted"
    assert requests(outcome) == [("POST", "fresh"), ("POST", "cancel")]
    stop = entry(outcome, "cancel")
    assert stop.status == 200
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert stop.path.endswith(f"/{abandoned['response_id']}/cancel")
    assert (abandoned["reason"], abandoned["cancelled"], abandoned["response_status"], abandoned["error"]) == (
        "exhausted",
        True,
        "cancelled",
        None,
    )
    # By now the model would have written the whole answer: the cancelled one's billing stopped.
    await asyncio.sleep(max(0.0, started + (events + 10) * PACE - time.monotonic()))
    assert entry(outcome, "fresh").billed_output_tokens < whole


@pytest.mark.parametrize("stop", ["cancel", "abort"])
async def test_a_stopped_run_records_the_response_it_cancels(fake_server, paced_server, stop):
    """A user's cancel (or an abort) of a run reading a background response stops the response
    and records it as every response a turn leaves behind is: the admin and analytics see it was
    cancelled, on the attempt that was reading it. The run still ends cancelled at once."""
    token = CancelToken()
    stopped_at: list[float] = []

    async def stop_soon():
        await asyncio.sleep(0.6)  # the model is still writing: the stream stalls after 12 events
        getattr(token, stop)()
        stopped_at.append(time.monotonic())

    task = asyncio.ensure_future(stop_soon())
    scenario = uuid.uuid4().hex
    outcome = await once(paced_server, STORY, ["stall:events=12,seconds=5"], cancel=token, scenario=scenario)
    ended = time.monotonic()
    await task
    assert outcome.status == "cancelled"
    assert outcome.result.error is not None
    assert outcome.result.error["kind"] == stop
    assert ended - stopped_at[0] < 1.5  # not the stall's 5 s: cancel beats everything else
    (stop_request,) = [e for e in paced_server.log_for(scenario) if e.understood_as == "cancel"]
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert (abandoned["reason"], abandoned["cancelled"], abandoned["response_status"], abandoned["error"]) == (
        stop,
        True,
        "cancelled",
        None,
    )
    assert abandoned["attempt"] == outcome.sink.attempts[0].index
    assert stop_request.path == f"/v1/responses/{abandoned['response_id']}/cancel"


async def test_a_break_with_no_resume_point_cancels_the_response_it_leaves(fake_server, paced_server):
    """A continuation (the re-attach found the response gone) breaks before its seam with the
    kept text is decided: there is no point to re-attach at, and the turn continues again. The
    continuation's background response, which nobody reads now, is cancelled beside that
    recovery, and billed only up to the cancel, not to the end of an answer nobody reads."""
    reference = await once(fake_server, STORY)
    events = event_count(fake_server, reference)
    started = time.monotonic()
    outcome = await once(paced_server, STORY, ["cut:events=12", "status:404", "cut:events=3"])
    assert_invariants(outcome, reference)
    assert [a.kind for a in outcome.sink.attempts] == ["initial", "native_resume", "continuation", "continuation"]
    assert requests(outcome) == [
        ("POST", "fresh"),
        ("GET", None),
        ("POST", "continue_message"),
        ("POST", "continue_message"),
        ("POST", "cancel"),
    ]
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert (abandoned["reason"], abandoned["cancelled"], abandoned["response_status"], abandoned["error"]) == (
        "no_resume_point",
        True,
        "cancelled",
        None,
    )
    assert abandoned["attempt"] == outcome.sink.attempts[2].index  # the break's attempt
    assert entry(outcome, "cancel").path.endswith(f"/{abandoned['response_id']}/cancel")
    # By now the model would have written both continuations whole: the cancelled one stopped.
    await asyncio.sleep(max(0.0, started + (2 * events + 10) * PACE - time.monotonic()))
    cut, finished = [
        e for e in paced_server.log_for(entry(outcome, "cancel").scenario) if e.understood_as == "continue_message"
    ]
    assert cut.billed_output_tokens < finished.billed_output_tokens


class CancelsAtBreak(CollectingSink):
    """The user cancels the run as its ``nth`` break is reported (during the backoff after it)."""

    def __init__(self, cancel: CancelToken, nth: int) -> None:
        super().__init__()
        self.cancel, self.nth = cancel, nth

    async def on_event(self, event: StructuredEvent) -> None:
        await super().on_event(event)
        if self.names().count("llm_stream_interrupted") == self.nth:
            self.cancel.cancel()


async def test_a_cancel_after_a_break_with_no_resume_point_cancels_the_response_once(fake_server, paced_server):
    """The break cancelled the response it left; the user then cancels the run while the turn
    backs off: the run ends cancelled at once, and that response is not cancelled (nor
    recorded) a second time."""
    cancel = CancelToken()
    config = with_config(backoff_schedule=(0.0, 5.0), backoff_scale=1.0)
    started = time.monotonic()
    outcome = await once(
        paced_server,
        STORY,
        ["cut:events=12", "status:404", "cut:events=3"],
        cancel=cancel,
        config=config,
        sink=CancelsAtBreak(cancel, 2),
    )
    assert outcome.status == "cancelled"
    assert time.monotonic() - started < 4.0  # not after the 5 s backoff
    assert [r[1] for r in requests(outcome)] == ["fresh", None, "continue_message", "cancel"]
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert (abandoned["reason"], abandoned["cancelled"]) == ("no_resume_point", True)


class FencedOut(CollectingSink):
    """A run's store once a newer claim holds the run: it refuses the record of an abandoned
    response (as the runs layer's fenced recorder does) with ``ClaimLost``."""

    async def on_event(self, event: StructuredEvent) -> None:
        if event.name == "llm_response_abandoned":
            raise ClaimLost("a newer claim holds the run")
        await super().on_event(event)


async def test_a_claim_lost_while_recording_an_abandon_stops_the_run(fake_server):
    """The cancel of a response left behind runs beside the recovery; recording it finds the run
    claimed by another worker. The run stops as on any lost claim: the turn's tool call is not
    executed, nor the next turn asked for, by this worker (the one holding the claim will)."""
    scenario = uuid.uuid4().hex
    sink = FencedOut()
    with pytest.raises(ClaimLost):
        await once(fake_server, TOOL, ["cut:events=22", "status:400"], scenario=scenario, sink=sink)
    seen = [e.understood_as for e in fake_server.log_for(scenario)]
    assert seen.count("fresh") == 1  # no request of a next turn (with the tool's result) was made
    assert "cancel" in seen
    assert not sink.messages[1:]  # nothing committed after the user's message: no tool result
    assert "llm_response_abandoned" not in sink.names()


async def background_response(server, reference, scenario: str, events: int) -> tuple[str, int, str]:
    """What a first worker had read of a background response when it died: the response is
    made (in ``scenario``, as the reference run's request) and read for ``events`` events. Its
    id, the sequence number of the last event read, and the text read."""
    import httpx

    request = reference.sink.attempts[0].request
    headers = {k: v for k, v in request["headers"].items() if v != "[redacted]"}
    headers["authorization"] = "Bearer k"
    headers["x-fake-scenario"] = scenario
    read: list = []
    url = f"{server.base_url}/v1/responses"
    decoder = SSEDecoder()
    async with httpx.AsyncClient() as client, client.stream("POST", url, json=request["json"], headers=headers) as r:
        async for chunk in r.aiter_bytes():
            read.extend(decoder.feed(chunk))
            if len(read) >= events:
                break
    payloads = [json.loads(e.data) for e in read[:events]]
    response_id = next(p["response"]["id"] for p in payloads if "response" in p)
    text = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
    return response_id, payloads[-1]["sequence_number"], text


@pytest.mark.parametrize("when", ["while_reattaching", "before_resuming"])
async def test_a_resumed_run_cancelled_stops_its_background_response(fake_server, paced_server, when):
    """A second worker resumes the run from a checkpoint that names the response; the user
    cancels it, before its re-attached stream sent anything (or before any worker held it): the
    provider is told to stop that response, which would go on being generated and billed."""
    reference = await once(fake_server, STORY)
    whole = reference.log[0].billed_output_tokens
    events = event_count(fake_server, reference)
    scenario = uuid.uuid4().hex
    started = time.monotonic()
    response_id, after, text = await background_response(paced_server, reference, scenario, 10)
    assert text  # the checkpoint holds some text, and the model is still writing
    store = InMemoryCheckpointStore()
    native = {"response_id": response_id, "after": after, "open_text": True}
    run_id = uuid.uuid4().hex
    await store.put(
        Checkpoint(run_id=run_id, turn=0, history_len=1, blocks=[{"type": "text", "text": text}], native=native)
    )
    cancel = CancelToken()
    if when == "before_resuming":
        cancel.cancel()
        faults: list[str] = []
    else:
        faults = ["stall:events=0,seconds=5"]  # the re-attach answers, then sends nothing

        async def cancel_soon():
            await asyncio.sleep(0.5)
            cancel.cancel()

        task = asyncio.ensure_future(cancel_soon())
    outcome = await once(
        paced_server, STORY, faults, checkpoints=store, run_id=run_id, resume=True, cancel=cancel, scenario=scenario
    )
    if when == "while_reattaching":
        await task
    assert outcome.status == "cancelled"
    log = paced_server.log_for(scenario)
    (stop,) = [e for e in log if e.understood_as == "cancel"]
    assert (stop.method, stop.status) == ("POST", 200)
    assert stop.path == f"/v1/responses/{response_id}/cancel"
    (abandoned,) = outcome.events("llm_response_abandoned")  # recorded, on the re-attach if it began
    assert (abandoned["response_id"], abandoned["reason"], abandoned["cancelled"]) == (response_id, "cancel", True)
    assert abandoned["attempt"] == (outcome.sink.attempts[0].index if outcome.sink.attempts else None)
    # By now the model would have written the whole answer: the cancelled one's billing stopped.
    await asyncio.sleep(max(0.0, started + (events + 10) * PACE - time.monotonic()))
    (made,) = [e for e in paced_server.log_for(scenario) if e.understood_as == "fresh"]
    assert made.billed_output_tokens < whole


class SlowCancel:
    """A transport whose cancel is answered only once the continuation (the third request, after
    the first and the refused re-attach) was opened: a recovery that waited for its cancel before
    going on would wait for it in vain."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seen: list[str] = []
        self.continued = asyncio.Event()

    async def open(self, method, url, headers, json_body, idle_timeout_s, connect_timeout_s):
        if url.endswith("/cancel"):
            await self.continued.wait()
            opened = await self.inner.open(method, url, headers, json_body, idle_timeout_s, connect_timeout_s)
            self.seen.append("cancel answered")
            return opened
        self.seen.append(f"{method} {url.rsplit('/v1', 1)[1].split('?')[0]}")
        if len(self.seen) == 3:
            self.continued.set()
        return await self.inner.open(method, url, headers, json_body, idle_timeout_s, connect_timeout_s)


async def test_the_continuation_does_not_wait_for_the_cancel(fake_server):
    """The re-attach is refused: the continuation is asked for while the cancel of the response
    left behind is still on its way (a slow cancel adds nothing to the recovery), and the cancel
    is still answered, and recorded, before the turn ends."""
    from streamrecover.engine.transport import HttpxTransport

    reference = await once(fake_server, TEXT)
    async with HttpxTransport() as inner:
        transport = SlowCancel(inner)
        outcome = await once(fake_server, TEXT, ["cut:events=12", "status:400"], transport=transport)
    assert_invariants(outcome, reference)
    assert transport.seen[2:] == ["POST /responses", "cancel answered"]
    assert requests(outcome)[2:] == [("POST", "continue_message"), ("POST", "cancel")]
    (abandoned,) = outcome.events("llm_response_abandoned")
    assert (abandoned["reason"], abandoned["response_status"], abandoned["error"]) == (
        "reattach_failed",
        "completed",
        None,
    )
