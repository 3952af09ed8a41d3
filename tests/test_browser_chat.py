"""The demo chat in Debian's Chromium against a real Daphne in embedded mode (what ``make
demo`` runs): whatever breaks, the text on the page ends equal to the committed message,
with no character missing or doubled, and model output is only ever text."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from streamrecover.testing.client import ClientView
from streamrecover.testing.tools import demo_registry

from . import browser_fixtures
from .e2e_helpers import ChatPage, browser_site

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser") / "demo.sqlite3"


@pytest.fixture(scope="module")
def demo_site(demo_db: Path) -> Iterator[str]:
    """A fresh SQLite demo (migrated, demo user) served by Daphne on a free port."""
    with browser_site(demo_db, ("streamrecover_demo_user",), STREAMRECOVER_FAKE_EVENT_DELAY="0.01") as url:
        yield url


browser = browser_fixtures.browser
chat = browser_fixtures.chat


def assert_page_shows_the_committed_answer(chat: ChatPage, run_id: str) -> dict[str, Any]:
    shown = chat.shown_assistant_texts()
    committed = chat.committed_assistant_texts(run_id)
    assert committed
    assert all(committed)
    assert shown == committed
    state = chat.state()
    assert state["stats"]["mismatches"] == 0  # every rebuilt turn equalled the committed one
    assert state["stats"]["checked"] >= 1
    return state


@pytest.mark.parametrize(
    ("scenario", "plan"),
    [("r1", "continue_text"), ("r3", "truncate_before_tool"), ("r4", "whole_restart")],
)
def test_each_recovery_plan_ends_with_the_committed_text_on_the_page(chat: ChatPage, scenario: str, plan: str) -> None:
    typed = "Tell me about lighthouses and the sea. [[words=120]]"
    run_id = chat.send(typed, scenario)
    assert chat.wait_until_finished() == "completed"
    state = assert_page_shows_the_committed_answer(chat, run_id)
    # the scenario steers the fake through the run's system prompt: the message is shown as typed
    shown = chat.page.locator("#sr-transcript li[data-role=user] .sr-text").first.text_content()
    assert shown == typed
    assert {(r["phase"], r["plan"]) for r in state["recoveries"]} == {("backoff", plan), ("continuing", plan)}
    recovery = chat.page.locator("#sr-recovery")
    assert recovery.is_visible()
    assert recovery.get_attribute("data-phase") == "recovered"
    # a whole restart kept nothing: the page says the answer started over, not that it went on
    said = "started over" if plan == "whole_restart" else "went on"
    assert recovery.text_content() == f"Recovered: the answer {said} after the break."
    if scenario == "r3":
        assert "get_weather" in chat.page.locator("#sr-transcript .sr-tool").first.text_content()
        # the tool result rides in a user turn (the provider's shape), but the reader did not write it
        roles = chat.page.locator("#sr-transcript li .sr-role").all_text_contents()
        assert roles == ["user", "assistant", "tool results", "assistant"]
        assert len(chat.shown_assistant_texts()) == 2  # the tool call's turn and the answer after the result
    if scenario == "r4":
        assert chat.page.locator("#sr-transcript .sr-thinking").count() == 1  # the restarted turn's only


def test_a_reload_in_the_middle_of_a_stream_loses_and_doubles_nothing(chat: ChatPage) -> None:
    run_id = chat.send("A long story about the northern sea. [[words=260]]", "r1")
    chat.page.wait_for_function("window.__streamrecover.recoveries.some(r => r.phase === 'continuing')")
    chat.wait_for_streamed_text(400)
    chat.page.reload()  # the URL is the thread's now: the page follows its latest run
    assert chat.wait_until_finished() == "completed"
    state = assert_page_shows_the_committed_answer(chat, run_id)
    first = state["snapshots"][0]  # after the reload (a lost frame would add a resync's)
    assert first["status"] in ("running", "recovering")
    assert first["partial"] == 1


def test_a_dropped_socket_and_a_lost_frame_are_caught_up(chat: ChatPage) -> None:
    run_id = chat.send("Another long story, about rivers. [[words=260]]")
    chat.wait_for_streamed_text(100)
    chat.page.evaluate("window.__streamrecover.client.dropConnection()")  # reconnects with ?after=
    chat.wait_for_streamed_text(600)
    chat.page.evaluate("window.__streamrecover.client.lastSeq -= 1")  # the next frame looks like a gap
    assert chat.wait_until_finished() == "completed"
    state = assert_page_shows_the_committed_answer(chat, run_id)
    assert state["stats"]["reconnects"] >= 1
    assert state["stats"]["gaps"] >= 1
    assert state["stats"]["resyncs"] >= 1
    assert len(state["snapshots"]) >= 2  # the first one, then the resync's


def test_a_follow_up_in_the_same_thread(chat: ChatPage) -> None:
    first = chat.send("Hello there. [[words=20]]")
    chat.wait_until_finished()
    second = chat.send("And again. [[words=25]]", "r1")
    assert chat.wait_until_finished() == "completed"
    assert chat.run_detail(first)["thread_id"] == chat.run_detail(second)["thread_id"]
    assert len(assert_page_shows_the_committed_answer(chat, second))
    assert len(chat.shown_assistant_texts()) == 2


def test_model_output_is_shown_as_text_never_run_as_html(chat: ChatPage) -> None:
    payload = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    run_id = chat.send(f"Say it [[text={payload}]]")
    assert chat.wait_until_finished() == "completed"
    assert chat.shown_assistant_texts() == [payload]
    assert chat.committed_assistant_texts(run_id) == [payload]
    assert chat.page.evaluate("typeof window.__pwned") == "undefined"
    assert chat.page.locator("#sr-transcript script, #sr-transcript img").count() == 0
    chat.page.reload()  # rendered again from the snapshot: still text
    chat.wait_until_finished()
    assert chat.shown_assistant_texts() == [payload]
    assert chat.page.evaluate("typeof window.__pwned") == "undefined"


# Marks what a reader holds on the page mid-stream: the earlier answer's text (selected, as a
# reader copying it would) and the streaming answer's first text block.
MARK = """() => {
  const earlier = document.querySelector('#sr-transcript li[data-committed=true][data-role=assistant] .sr-text');
  const range = document.createRange();
  range.setStart(earlier.firstChild, 0);
  range.setEnd(earlier.firstChild, 20);
  getSelection().removeAllRanges();
  getSelection().addRange(range);
  window.__held = {earlier, streaming: document.querySelector('#sr-transcript [data-streaming=true] .sr-text')};
  return getSelection().toString();
}"""
STILL_HELD = """() => ({
  earlier: window.__held.earlier.isConnected,
  streaming: window.__held.streaming.isConnected
    && window.__held.streaming === document.querySelector('#sr-transcript [data-streaming=true] .sr-text'),
  selected: getSelection().toString(),
})"""


def test_a_streaming_answer_leaves_earlier_messages_and_a_selection_in_them_in_place(chat: ChatPage) -> None:
    chat.page.goto(f"{chat.base_url}/streamrecover/")  # a new thread
    chat.send("Hello there. [[words=30]]")
    chat.wait_until_finished()
    run_id = chat.send("A long story about the harbour. [[words=900]]")
    chat.wait_for_streamed_text(100)
    selected = chat.page.evaluate(MARK)
    assert len(selected) == 20
    chat.wait_for_streamed_text(1500)  # many deltas later, still streaming
    assert chat.page.evaluate(STILL_HELD) == {"earlier": True, "streaming": True, "selected": selected}
    chat.page.evaluate("window.__streamrecover.client.lastSeq -= 1")  # a gap: the resync's snapshot
    chat.page.wait_for_function("window.__streamrecover.snapshots.length >= 2")
    chat.wait_for_streamed_text(2500)
    assert chat.page.evaluate(STILL_HELD) == {"earlier": True, "streaming": True, "selected": selected}
    assert chat.wait_until_finished() == "completed"
    assert_page_shows_the_committed_answer(chat, run_id)
    assert len(chat.shown_assistant_texts()) == 2
    assert chat.page.evaluate("window.__held.earlier.isConnected")  # the commit rebuilt only the new answer
    assert chat.page.evaluate("getSelection().toString()") == selected


def test_without_javascript_a_thread_shows_its_messages_and_tool_calls_as_the_script_does(
    chat: ChatPage, browser: Any
) -> None:
    chat.page.goto(f"{chat.base_url}/streamrecover/")  # a new thread
    chat.send("Weather in Zürich? [[words=20]]", "r3")
    assert chat.wait_until_finished() == "completed"
    shown = "#sr-transcript .sr-role, #sr-transcript .sr-text, #sr-transcript .sr-tool, #sr-transcript .sr-tool-result"
    scripted = chat.page.locator(shown).all_text_contents()
    plain_context = browser.new_context(java_script_enabled=False, storage_state=chat.page.context.storage_state())
    plain = plain_context.new_page()
    plain.goto(chat.page.url)  # the thread's page, rendered by the server
    rendered = plain.locator(shown).all_text_contents()
    plain_context.close()
    tool_calls = [text for text in scripted if text.startswith("\U0001f527")]
    assert tool_calls
    assert all('({"' in text and text.endswith("})") for text in tool_calls)  # the input as JSON
    assert rendered == scripted


def test_cancel_stops_the_run(chat: ChatPage) -> None:
    run_id = chat.send("A very long story. [[words=2000]]")
    chat.wait_for_streamed_text(50)
    chat.page.click("#sr-cancel")
    assert chat.wait_until_finished() == "cancelled"
    assert chat.run_detail(run_id)["status"] == "cancelled"


def test_a_new_threads_title_in_the_sidebar_is_the_stored_one_even_cut_at_an_emoji(chat: ChatPage) -> None:
    chat.page.goto(f"{chat.base_url}/streamrecover/")  # a new thread, whatever the tests above left open
    chat.send("x" * 79 + "\U0001f680 and more words after it [[words=5]]")  # the emoji spans code units 80 and 81
    chat.wait_until_finished()
    live = chat.page.locator("#sr-thread-list a").first.text_content()
    assert live == "x" * 79 + "\U0001f680"  # never half a surrogate pair
    chat.page.reload()
    chat.wait_until_finished()
    assert chat.page.locator("#sr-thread-list a").first.text_content() == live


def test_the_demos_finished_runs_are_folded_into_the_analytics_rollup(chat: ChatPage, demo_db: Path) -> None:
    """Embedded mode (SQLite, runs in Daphne's threads): each finished run (this one, and any
    the tests above finished) was folded into the rollup as it settled, counted there once."""
    chat.send("Tell me about harbours. [[words=40]]", "r1")
    assert chat.wait_until_finished() == "completed"
    terminal = "('completed', 'failed', 'exhausted', 'cancelled')"
    deadline = time.monotonic() + 15
    with sqlite3.connect(demo_db) as db:
        while True:
            settled, folded = db.execute(
                f"SELECT count(*), coalesce(sum(analytics_folded), 0) FROM streamrecover_run WHERE status IN {terminal}"
            ).fetchone()
            if (settled and settled == folded) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert settled >= 1
        assert folded == settled
        (rolled,) = db.execute("SELECT coalesce(sum(runs), 0) FROM streamrecover_analyticsrollup").fetchone()
        assert rolled == settled


# ---- client.js applies frames exactly like the protocol's reducer (testing/client.py) --------------

CLIENT_JS = Path(__file__).resolve().parent.parent / "streamrecover" / "static" / "streamrecover" / "client.js"
JS_TRACE = """frames => {
  const client = new StreamRecoverClient("ws://unused", {});
  const trace = frames.map(frame => {
    client.handle(frame);
    return [client.messages.length, client.reconstructed()];
  });
  return {trace, messages: client.messages, stats: client.stats};
}"""


def _run_async(make: Any) -> Any:
    """``asyncio.run`` in another thread: Playwright's sync API owns this thread's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _engine_frames(fake_server: Any, prompt: str, **kwargs: Any) -> list[dict[str, Any]]:
    from .harness import run

    outcome = _run_async(lambda: run(fake_server, prompt, **kwargs))
    assert outcome.status == "completed"
    return outcome.sink.frames


def _coalesced(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same frames through a publisher that merges deltas up to 16 characters."""
    from streamrecover.live.buffer import InMemoryFrameBuffer
    from streamrecover.live.publisher import Publisher

    sent: list[dict[str, Any]] = []

    class Layer:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            sent.append(message["frame"])

    async def publish() -> None:
        publisher = Publisher(str(uuid.uuid4()), InMemoryFrameBuffer(), Layer(), coalesce_s=60, max_chars=16)
        for frame in frames:
            await publisher.on_frame(frame)
        await publisher.aclose()

    _run_async(publish)
    assert len(sent) < len(frames)
    return sent


def _python_trace(frames: list[dict[str, Any]]) -> list[list[Any]]:
    view = ClientView()
    trace = []
    for frame in frames:
        view.apply(frame)
        trace.append([len(view.messages), view.reconstructed()])
    return trace


@pytest.fixture(scope="module")
def client_page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    page.set_content("<!doctype html><title>client.js</title>")
    page.add_script_tag(path=str(CLIENT_JS))
    yield page
    page.close()


@pytest.mark.parametrize(
    ("prompt", "kwargs"),
    [
        ("R1 [[words=80]]", {"faults": ["cut:bytes=1500"]}),
        ("R3 [[text=Let me check the weather for you.]] [[tool=get_weather]]", {"faults": ["cut:events=15"]}),
        ("R4 [[words=40]]", {"faults": ["cut:events=6"], "thinking_budget": 2048}),
        ("Tools [[tools=2]]", {"faults": ["error:events=40,type=overloaded_error"]}),
    ],
)
@pytest.mark.parametrize("coalesce", [False, True])
def test_client_js_rebuilds_exactly_what_the_reference_client_does(
    client_page: Any, fake_server: Any, prompt: str, kwargs: dict[str, Any], coalesce: bool
) -> None:
    frames = _engine_frames(fake_server, prompt, tools=demo_registry(), **kwargs)
    if coalesce:
        frames = _coalesced(frames)
    result = client_page.evaluate(JS_TRACE, frames)
    assert result["trace"] == _python_trace(frames)
    assert result["stats"]["gaps"] == 0
    assert result["stats"]["mismatches"] == 0
    assert result["stats"]["checked"] == sum(
        1 for f in frames if f["type"] == "message_committed" and f["message"]["role"] == "assistant"
    )


def test_client_js_goes_on_from_a_snapshot_taken_inside_a_tool_call(client_page: Any, fake_server: Any) -> None:
    from streamrecover.live.snapshot import RunRecord, build_snapshot
    from streamrecover.live.state import RunState

    frames = _engine_frames(fake_server, "Weather? [[tool=get_weather]]", tools=demo_registry())
    arguments = [i for i, f in enumerate(frames) if f["type"] == "tool_call_delta" and f["arguments_delta"]]
    cut = arguments[1]  # the arguments' first delta arrived, the rest did not
    state = RunState()
    for frame in frames[:cut]:
        state.apply(frame)
    user = {"role": "user", "content": [{"type": "text", "text": "Weather? [[tool=get_weather]]"}]}
    snapshot = build_snapshot(RunRecord(frames[0]["run_id"], "running", None, {0: user}), state)
    assert snapshot["partial"][-1]["content"]["partial_json"]  # the half-received arguments, verbatim
    result = client_page.evaluate(JS_TRACE, [snapshot, *frames[cut:]])
    view = ClientView(messages=[user]).apply_all(frames)
    assert result["messages"] == view.messages
    assert result["stats"]["mismatches"] == 0
    assert result["stats"]["checked"] == 2


def test_client_js_shows_server_tools_citations_and_compaction_like_the_reference_client(
    client_page: Any, fake_server: Any
) -> None:
    """A server tool's input streamed after its block frame, citations, a compaction block
    re-sent whole: the same trace as the Python reducer, also from a snapshot taken inside
    the server tool's input."""
    from streamrecover.live.snapshot import RunRecord, build_snapshot
    from streamrecover.live.state import RunState

    from .recorded_reading import compaction_stream, mcp_stream, web_search_stream

    for raw in (web_search_stream(), mcp_stream(), compaction_stream()):
        frames = _engine_frames(fake_server, "Replay", recording=raw, model="claude-sonnet-4-5")
        result = client_page.evaluate(JS_TRACE, frames)
        assert result["trace"] == _python_trace(frames)
        assert result["stats"]["mismatches"] == 0
        assert result["stats"]["checked"] == 1
    frames = _engine_frames(fake_server, "Replay", recording=web_search_stream(), model="claude-sonnet-4-5")
    cut = [i for i, f in enumerate(frames) if f["type"] == "tool_call_delta" and f["arguments_delta"]][1]
    state = RunState()
    for frame in frames[:cut]:
        state.apply(frame)
    user = {"role": "user", "content": [{"type": "text", "text": "Replay"}]}
    snapshot = build_snapshot(RunRecord(frames[0]["run_id"], "running", None, {0: user}), state)
    result = client_page.evaluate(JS_TRACE, [snapshot, *frames[cut:]])
    assert result["messages"] == ClientView(messages=[user]).apply_all(frames).messages
    assert result["stats"]["mismatches"] == 0


@pytest.mark.parametrize("faults", [[], ["cut:events=6"]])
def test_client_js_finds_a_gemini_function_call_with_its_thought_signature_equal_to_what_it_rebuilt(
    client_page: Any, fake_server: Any, faults: list[str]
) -> None:
    """A Gemini 3 function call is committed with its thought signature, which no frame carries:
    client.js counted that turn as a mismatch (``client.stats``, what the page and its tests
    check), the reference client did not."""
    frames = _engine_frames(
        fake_server,
        "Weather? [[words=30]] [[tool=get_weather]]",
        wire="gemini",
        model="gemini-3-pro-preview",
        tools=demo_registry(),
        thinking_budget=2048,
        faults=faults,
    )
    committed = [
        f["message"] for f in frames if f["type"] == "message_committed" and f["message"]["role"] == "assistant"
    ]
    assert any(b["type"] == "tool_use" and b.get("signature") for m in committed for b in m["content"])
    result = client_page.evaluate(JS_TRACE, frames)
    assert result["trace"] == _python_trace(frames)
    assert result["stats"]["checked"] == len(committed)
    assert result["stats"]["mismatches"] == 0
    view = ClientView().apply_all(frames)
    assert [rebuilt == stored for rebuilt, stored in view.turns] == [True] * len(committed)


# ---- chat.js renders each frame in place: the transcript follows the reference client ---------------

CHAT_JS = CLIENT_JS.with_name("chat.js")
CHAT_PAGE = """<!doctype html><title>chat.js</title>
<span id="sr-status"></span><span id="sr-recovery" hidden></span><span id="sr-connection" hidden></span>
<ol id="sr-transcript"><li id="server-rendered">rendered by the server</li></ol><p id="sr-error" hidden></p>
<form id="sr-form" action="/chat/"><textarea id="sr-prompt"></textarea>
<button id="sr-send">Send</button><button type="button" id="sr-cancel">Cancel</button></form>
<ul id="sr-thread-list"></ul>
<script id="sr-config" type="application/json">{"runId": "r", "threadId": 1, "wsUrl": "ws://unused/ws/",
 "urls": {"thread": "/chat/threads/{id}/", "run": "/api/runs/{id}/", "cancel": "/api/runs/{id}/cancel/"}}</script>
<script>
  window.requestAnimationFrame = render => { render(); return 0; };  // one render per frame, at once
  window.WebSocket = function () { this.readyState = 1; window.__socket = this; };
  window.WebSocket.prototype.send = () => {};
  window.WebSocket.prototype.close = () => {};
</script>"""
# Each <li> of the transcript: its node's number (given on first sight), whether it is committed,
# its role, and its blocks (a text's or a thinking's text; other blocks by their class).
JS_SHOWN_TRACE = """frames => {
  let next = 0;
  const shown = () => Array.from(document.querySelectorAll('#sr-transcript > li')).map(li => {
    li.__n = li.__n || ++next;
    const blocks = Array.from(li.children).slice(1).map(b =>
      b.matches('.sr-text') ? ['text', b.textContent]
        : b.matches('details.sr-thinking') ? ['thinking', b.lastChild.textContent] : [b.className, null]);
    return [li.__n, li.dataset.committed === 'true', li.dataset.role, blocks];
  });
  return frames.map(frame => {
    window.__socket.onmessage({data: JSON.stringify(frame)});
    return shown();
  });
}"""


def _shown_blocks(content: list[dict[str, Any]]) -> list[list[Any]]:
    shown: list[list[Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            shown.append(["text", block["text"]])
        elif kind == "thinking":
            shown.append(["thinking", block["thinking"]])
        else:
            shown.append([{"tool_use": "sr-tool", "tool_result": "sr-tool-result"}.get(kind, "sr-thinking"), None])
    return shown


def _expected_transcripts(frames: list[dict[str, Any]]) -> list[list[list[Any]]]:
    """What the transcript should show after each frame (the reference client's view), without node numbers."""
    view = ClientView()
    expected = []
    for frame in frames:
        view.apply(frame)
        items = [[True, m["role"], _shown_blocks(m["content"])] for m in view.messages]
        if view.blocks:
            items.append([False, "assistant", _shown_blocks(view.reconstructed())])
        expected.append(items)
    return expected


@pytest.mark.parametrize(
    ("prompt", "kwargs", "notice"),
    [
        (
            "R3 [[text=Let me check the weather for you.]] [[tool=get_weather]]",
            {"faults": ["cut:events=15"]},
            "tool_call_cancel",
        ),
        ("R4 [[words=40]]", {"faults": ["cut:events=6"], "thinking_budget": 2048}, "stream_reset"),
        ("Tools [[tools=2]]", {"faults": ["error:events=40,type=overloaded_error"]}, "tool_call_cancel"),
    ],
)
def test_chat_js_renders_each_frame_in_place_and_shows_what_the_reference_client_rebuilds(
    browser: Any, fake_server: Any, prompt: str, kwargs: dict[str, Any], notice: str
) -> None:
    """Each frame, live or a snapshot taken halfway (as after a reconnect), leaves the page
    showing exactly the reference client's messages and in-flight blocks; a message once shown
    keeps its node to the end."""
    from streamrecover.live.snapshot import RunRecord, build_snapshot
    from streamrecover.live.state import RunState

    frames = _engine_frames(fake_server, prompt, tools=demo_registry(), **kwargs)
    assert notice in {f["type"] for f in frames}
    user = {"role": "user", "content": [{"type": "text", "text": prompt}]}
    run_id = frames[0]["run_id"]
    cut = len(frames) // 2
    state = RunState()
    for frame in frames[:cut]:
        state.apply(frame)
    frames = [
        build_snapshot(RunRecord(run_id, "running", None, {0: user}), None),  # what the page gets on connect
        *frames[:cut],
        build_snapshot(RunRecord(run_id, "running", None, {0: user}), state),
        *frames[cut:],
    ]
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_content(CHAT_PAGE)
    page.add_script_tag(path=str(CLIENT_JS))
    page.add_script_tag(path=str(CHAT_JS))
    trace = page.evaluate(JS_SHOWN_TRACE, frames)
    page.close()
    assert errors == []
    assert [[item[1:] for item in shown] for shown in trace] == _expected_transcripts(frames)
    nodes: dict[int, int] = {}  # a committed message's position: its <li>'s number
    for shown in trace:
        for position, item in enumerate(shown):
            if item[1]:
                assert nodes.setdefault(position, item[0]) == item[0], (position, shown)


# ---- a tool call's input reads the same on every surface ----------------------------------------

LOCATE_ARGUMENTS = ('{"city": "Zürich", ', '"lat": 47.0, "lon": 8.55, ', '"radius_km": 1e-7, "2": "second"}')


def _tool_call_turn(fake_server: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A model's answer that calls a tool with numbers Python and JavaScript write differently
    (a recorded stream, through the engine): the frames up to its commit, and the committed message."""
    from .harness import run
    from .recorded_reading import _args, _text, anthropic_stream

    raw = anthropic_stream(
        [
            ({"type": "text", "text": ""}, _text("Let me look it up.")),
            ({"type": "tool_use", "id": "toolu_01Locate", "name": "locate", "input": {}}, _args(*LOCATE_ARGUMENTS)),
        ],
        stop="tool_use",
    )
    outcome = _run_async(lambda: run(fake_server, "Locate", recording=raw, model="claude-sonnet-4-5"))
    frames = outcome.sink.frames
    end = next(
        i for i, f in enumerate(frames) if f["type"] == "message_committed" and f["message"]["role"] == "assistant"
    )
    return frames[: end + 1], frames[end]["message"]


def test_a_tool_calls_input_reads_the_same_live_after_a_reload_and_without_javascript(
    chat: ChatPage, browser: Any, fake_server: Any, demo_db: Path
) -> None:
    """The input shown once the call is committed, live (from its message_committed frame), after
    a reload (from the stored message) and on the page rendered without JavaScript: one text, the
    stored value as the script writes it. The page without JavaScript wrote Python's JSON
    (``47.0``, ``1e-07``, the keys as stored) where the script shows ``47``, ``1e-7`` and the
    integer-like key first."""
    from streamrecover.live.snapshot import RunRecord, build_snapshot

    frames, message = _tool_call_turn(fake_server)
    assert message["content"][1]["input"] == {
        "city": "Zürich",
        "lat": 47.0,
        "lon": 8.55,
        "radius_km": 1e-7,
        "2": "second",
    }
    user = {"role": "user", "content": [{"type": "text", "text": "Locate"}]}
    page = browser.new_page()
    page.set_content(CHAT_PAGE)
    page.add_script_tag(path=str(CLIENT_JS))
    page.add_script_tag(path=str(CHAT_JS))
    page.evaluate(
        JS_SHOWN_TRACE, [build_snapshot(RunRecord(frames[0]["run_id"], "running", None, {0: user}), None), *frames]
    )
    live = page.locator("#sr-transcript .sr-tool").all_text_contents()
    page.close()

    # the same answer, stored in a thread of the demo (SQLite keeps the JSON text as written)
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    chat.send("Where is Zürich? [[words=5]]")
    assert chat.wait_until_finished() == "completed"
    thread_id = int(chat.page.evaluate("window.__streamrecover.threadId"))
    with sqlite3.connect(demo_db) as db:
        db.execute(
            "UPDATE streamrecover_message SET content = ? WHERE id = (SELECT id FROM streamrecover_message"
            " WHERE thread_id = ? AND role = 'assistant' ORDER BY position DESC LIMIT 1)",
            (json.dumps(message["content"]), thread_id),
        )
    chat.page.reload()  # the thread's page
    chat.wait_until_finished()
    reloaded = chat.page.locator("#sr-transcript .sr-tool").all_text_contents()
    plain_context = browser.new_context(java_script_enabled=False, storage_state=chat.page.context.storage_state())
    plain = plain_context.new_page()
    plain.goto(chat.page.url)
    rendered = plain.locator("#sr-transcript .sr-tool").all_text_contents()
    plain_context.close()

    expected = '\U0001f527 locate({"2":"second","city":"Zürich","lat":47,"lon":8.55,"radius_km":1e-7})'
    assert live == [expected]
    assert reloaded == [expected]
    assert rendered == [expected]


def test_the_page_without_javascript_writes_json_values_as_chromium_writes_them(client_page: Any) -> None:
    """``as_json`` (a tool call's input, a tool result's content on the page rendered without
    JavaScript) against Chromium's own ``JSON.stringify`` of the same value, received as JSON as
    the script receives it: numbers as doubles, integer-like keys first, lone surrogates escaped."""
    from streamrecover.templatetags.streamrecover_chat import as_json

    values: list[Any] = [
        {"city": "Zürich", "lat": 47.0, "lon": 8.55, "radius_km": 1e-7, "2": "second"},
        [3.0, -0.0, 0.1, 1.5e-6, 1e-6, 1e-7, 12.5, 100.0, 1e16, 1e20, 1e21, 5e-324, 1.7976931348623157e308],
        [2**53 + 1, 123456789012345678901234, -(10**30), 0, -7],
        {"10": 1, "9": 2, "a": 3, "01": 4, "4294967295": 5, "4294967294": 6, "": 7, "-1": 8},
        ['quote " backslash \\ newline \n tab \t nul \x00 \x1f \x7f \u2028 café 🚀 \ud800 <b>&'],
        {"nested": [{"b": None, "a": [True, False, {}], "ä": []}]},
    ]
    received = [json.dumps(value) for value in values]  # as a frame carries it
    written = client_page.evaluate("texts => texts.map(text => JSON.stringify(JSON.parse(text)))", received)
    assert [as_json(value) for value in values] == written


def test_on_a_phone_the_chat_fits_the_screen_fault_chooser_included(chat: ChatPage) -> None:
    """At 390 px (a phone) nothing sticks out sideways: the fault chooser's long labels made the page scroll."""
    chat.page.set_viewport_size({"width": 390, "height": 844})
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    chat.page.select_option("#sr-scenario", "r3")  # the longest label
    wider = chat.page.evaluate(
        "() => { const w = document.documentElement.clientWidth;"
        " return {scroll: document.documentElement.scrollWidth - w,"
        " sticking_out: Array.from(document.querySelectorAll('body *'))"
        ".filter(e => e.getBoundingClientRect().right > w + 1).map(e => e.tagName + '#' + e.id)}; }"
    )
    assert wider == {"scroll": 0, "sticking_out": []}
    run_id = chat.send("Hello from a phone", scenario="r1")
    assert chat.wait_until_finished() == "completed"
    assert chat.shown_assistant_texts() == chat.committed_assistant_texts(run_id)


def test_out_of_continuations_the_page_counts_them_as_the_run_and_its_error_do(chat: ChatPage) -> None:
    """The exhausted scenario: the first call and two continuations break. The page said "after 2
    attempts" beside an error saying "2 continuation attempts" and a run with 3 attempts."""
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    run_id = chat.send("Tell me about lighthouses.", "exhausted")
    assert chat.wait_until_finished() == "exhausted"
    attempts = chat.run_detail(run_id)["attempts"]
    assert attempts["count"] == 3
    continuations = attempts["by_kind"]["continuation"]
    assert continuations == 2
    notice = chat.page.locator("#sr-recovery")
    assert notice.get_attribute("data-phase") == "exhausted"
    assert notice.text_content() == f"Gave up after {continuations} continuation attempts (continue_text)"
    assert f"gave up after {continuations} continuation attempts" in chat.page.locator("#sr-error").text_content()


def test_a_second_tab_told_the_thread_is_busy_shows_that_run_and_can_cancel_it(chat: ChatPage) -> None:
    """Two tabs on one thread: the second's message is refused ("wait for it or cancel it"); that tab
    showed neither the run nor a Cancel it could use. It follows the run now, its words kept for later."""
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    chat.send("A first question. [[words=10]]")
    chat.wait_until_finished()
    other = ChatPage(chat.page.context.new_page(), chat.base_url)
    other.page.goto(chat.page.url)  # the same thread, its last run finished
    # a tab that missed the run's announcement (its thread socket was down)
    other.page.wait_for_function("window.__streamrecover.threadWatch.socket?.readyState === 1")
    other.page.evaluate("window.__streamrecover.threadWatch.close()")
    busy_run = chat.send("A long follow-up. [[words=2000]]")
    other.page.fill("#sr-prompt", "Mine, meanwhile.")
    other.page.click("#sr-send")
    other.page.wait_for_function("id => window.__streamrecover.runId === id", arg=busy_run, timeout=5_000)
    assert "in progress" in other.page.locator("#sr-error").text_content()
    other.wait_for_streamed_text(20)  # the other tab's answer streams here too
    assert other.page.locator("#sr-cancel").is_enabled()
    assert other.page.locator("#sr-prompt").input_value() == "Mine, meanwhile."  # to send once it is over
    other.page.click("#sr-cancel")
    assert other.wait_until_finished() == "cancelled"
    assert chat.wait_until_finished() == "cancelled"
    assert other.page.locator("#sr-error").is_hidden()  # over: "in progress" no longer holds
    assert other.page.locator("#sr-send").is_enabled()
    assert other.errors == []
    other.page.close()


def test_a_second_page_on_the_thread_shows_a_run_started_in_the_first_as_it_streams(chat: ChatPage) -> None:
    """Two pages on one thread: a run started in the first showed in the second only once that one
    sent a message or was reloaded. It streams there now, as in the first, without a reload."""
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    first = chat.send("A first question. [[words=10]]")
    assert chat.wait_until_finished() == "completed"
    other = ChatPage(chat.page.context.new_page(), chat.base_url)
    other.page.goto(chat.page.url)  # the same thread, its last run finished
    # its thread socket is open and listening (the latest run comes after it joined the group)
    other.page.wait_for_function("id => window.__streamrecover.threadWatch?.lastRunId === id", arg=first)
    other.page.evaluate("window.__loadedOnce = true")  # gone if the page reloads
    run_id = chat.send("Tell me about harbours. [[words=300]]")
    other.page.wait_for_function("id => window.__streamrecover.runId === id", arg=run_id, timeout=5_000)
    other.wait_for_streamed_text(20)  # its deltas, live, while the first page's stream goes on
    assert other.page.locator("#sr-cancel").is_enabled()
    assert chat.wait_until_finished() == "completed"
    assert other.wait_until_finished() == "completed"
    committed = chat.committed_assistant_texts(run_id)
    assert other.shown_assistant_texts() == committed == chat.shown_assistant_texts()
    assert other.page.evaluate("window.__loadedOnce") is True
    assert other.state()["stats"]["mismatches"] == 0
    assert other.errors == []
    other.page.close()


@pytest.mark.parametrize(
    ("scenario", "status", "live"),
    [
        ("r1", "completed", "Recovered: the answer went on after the break."),
        ("r4", "completed", "Recovered: the answer started over after the break."),
        ("exhausted", "exhausted", "Gave up after 2 continuation attempts (continue_text)"),
    ],
)
def test_a_recovered_answer_still_says_so_after_a_reload(chat: ChatPage, scenario: str, status: str, live: str) -> None:
    """The page said how the answer was recovered (or that it gave up) until a reload; then only
    a continuation said so, and a whole restart or an exhausted run said nothing."""
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    chat.send("Tell me about harbours.", scenario)
    assert chat.wait_until_finished() == status
    notice = chat.page.locator("#sr-recovery")
    assert notice.text_content() == live
    phase = notice.get_attribute("data-phase")
    chat.page.reload()
    assert chat.wait_until_finished() == status
    assert notice.is_visible()
    assert notice.text_content() == live
    assert notice.get_attribute("data-phase") == phase


def test_a_blank_message_is_refused_with_a_word_not_in_silence(chat: ChatPage) -> None:
    """Spaces pass the box's ``required``; the script then did nothing at all. The page without
    JavaScript answers "This field is required."; the script says so too."""
    chat.page.goto(f"{chat.base_url}/streamrecover/")
    chat.page.fill("#sr-prompt", "   \n  ")
    chat.page.click("#sr-send")
    error = chat.page.locator("#sr-error")
    error.wait_for(state="visible", timeout=3_000)
    assert error.text_content() == "This field is required."
    assert chat.page.evaluate("window.__streamrecover.runId") is None  # nothing was sent
    run_id = chat.send("Now with words. [[words=5]]")
    assert chat.wait_until_finished() == "completed"
    assert error.is_hidden()
    assert chat.shown_assistant_texts() == chat.committed_assistant_texts(run_id)
