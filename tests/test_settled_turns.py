"""A turn is settled once: a run whose worker died after committing a message but before the
run was marked completed is executed again by the next worker, which must go on from what
was committed (issue 10, "a turn committed twice").

Each test completes a run, puts it back in the state a dying worker leaves (the run still
``running`` with a stale heartbeat, or ``queued`` after the sweep, the thread cut after the
message that was the last one committed), and executes it again through the Django layer
(``runs.execution.execute_run``), in both wire formats of the fake provider.
"""

from __future__ import annotations

import asyncio
import io
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections
from django.utils import timezone
from structlog.testing import capture_logs

from streamrecover import dispatch, starter
from streamrecover.engine.sink import CollectingSink
from streamrecover.models import Attempt, Message, Run, StreamCheckpoint, ToolCallResult
from streamrecover.runs import execution, lifecycle
from streamrecover.runs.checkpoints import REDIS_KEY_PREFIX, checkpoint_store_from_settings
from streamrecover.testing import demo_registry
from streamrecover.testing.client import ClientView
from streamrecover.testing.fake.local import local_fake_server

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = {"openai": "gpt-4o", "anthropic": "claude-3-7-sonnet"}
STORY = "Tell me a story about a lighthouse [[words=60]]"
WEATHER = "Weather in Paris? [[words=20]] [[tool=get_weather]]"


def _provider_calls() -> int:
    return len(local_fake_server().log)


def _thread(run: Run) -> list[dict[str, Any]]:
    return Message.objects.of_thread(run.thread_id).canonical()


def _completed(prompt: str, model: str, **options: Any) -> Run:
    run = lifecycle.create_run(prompt=prompt, model=model, **options)
    result = asyncio.run(execution.execute_run(str(run.pk)))
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    run.refresh_from_db()
    return run


def _put_back(run: Run, status: str, keep_messages: int | None = None) -> None:
    """The state a worker that died mid-settle leaves: not terminal, last claimed by a dead
    worker (a stale heartbeat) or put back in the queue by the sweeper; with ``keep_messages``,
    the thread as it was when the worker died (the later messages never committed)."""
    long_ago = timezone.now() - timedelta(minutes=10)
    worker = "gone:1" if status == Run.Status.RUNNING else ""
    Run.objects.filter(pk=run.pk).update(
        status=status, worker=worker, heartbeat_at=long_ago, finished_at=None, claims=1
    )
    if keep_messages is not None:
        Message.objects.filter(thread_id=run.thread_id, position__gte=keep_messages).delete()


def _assert_no_empty_assistant(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        assert message["content"], f"empty {message['role']} message in {messages}"


@pytest.mark.parametrize("status", [Run.Status.RUNNING, Run.Status.QUEUED])
@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_run_re_claimed_after_its_final_commit_asks_nothing_and_commits_nothing(wire, status):
    run = _completed(STORY, MODELS[wire])
    committed = _thread(run)
    assert [m["role"] for m in committed] == ["user", "assistant"]
    attempts, tokens = Attempt.objects.of_run(run.pk).count(), (run.input_tokens, run.output_tokens)
    _put_back(run, status)

    calls = _provider_calls()
    result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2"))

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert _provider_calls() == calls  # not asked, not billed again
    assert result.new_messages == []
    assert _thread(run) == committed
    _assert_no_empty_assistant(_thread(run))
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert run.finished_at is not None
    assert Attempt.objects.of_run(run.pk).count() == attempts
    assert (run.input_tokens, run.output_tokens) == tokens


@pytest.mark.parametrize("result_stored", [False, True], ids=["died_during_the_call", "died_after_the_call"])
@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_run_re_claimed_after_committing_its_tool_calls_runs_them_and_goes_on(wire, result_stored):
    run = _completed(WEATHER, MODELS[wire], demo_tools=True)
    committed = _thread(run)
    assert [m["role"] for m in committed] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in committed[1]["content"]][-1] == "tool_use"
    _put_back(run, Run.Status.RUNNING, keep_messages=2)  # died before the tool results were committed
    if not result_stored:
        ToolCallResult.objects.filter(run=run).delete()

    tools = demo_registry()
    calls = _provider_calls()
    result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2", tools=tools))

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    # a stored result is used as it is; a call that left none is made again
    assert [name for name, _ in tools.calls] == ([] if result_stored else ["get_weather"])
    assert _provider_calls() == calls + 1  # the next turn only: the tool-calling turn is not redone
    assert _thread(run) == committed
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_run_re_claimed_after_committing_tool_results_goes_on_without_running_them_again(wire):
    run = _completed(WEATHER, MODELS[wire], demo_tools=True)
    committed = _thread(run)
    _put_back(run, Run.Status.QUEUED, keep_messages=3)  # died before the last answer was committed

    tools = demo_registry()
    calls = _provider_calls()
    result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2", tools=tools))

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert tools.calls == []
    assert _provider_calls() == calls + 1
    assert _thread(run) == committed
    _assert_no_empty_assistant(_thread(run))
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED


def _plant_unreadable_checkpoint(run: Run, store: str) -> None:
    """What a worker of another version (or a corrupted store) left for the run's turn: in the
    database a checkpoint of an older schema (no ``history_len``), in Redis bytes that are not JSON."""
    if store == "orm":
        data = {
            "run_id": str(run.pk),
            "turn": 1,
            "blocks": [{"type": "text", "text": "It is"}],
            "updated_at": time.time(),
        }
        StreamCheckpoint.objects.create(run_id=run.pk, data=data, updated_at=timezone.now())
        return
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        client.set(f"{REDIS_KEY_PREFIX}{run.pk}", b"{not json \xff")
        client.sadd(f"{REDIS_KEY_PREFIX}index", str(run.pk))
    finally:
        client.close()


@pytest.mark.parametrize("store", ["orm", "redis"])
def test_a_run_whose_checkpoint_cannot_be_read_starts_its_turn_over_from_what_was_committed(store, settings):
    settings.STREAMRECOVER = {**settings.STREAMRECOVER, "CHECKPOINT_STORE": store}
    run = _completed(WEATHER, MODELS["anthropic"], demo_tools=True)
    committed = _thread(run)
    _put_back(run, Run.Status.RUNNING, keep_messages=3)  # died in the last turn, its checkpoint unreadable
    _plant_unreadable_checkpoint(run, store)

    tools = demo_registry()
    with capture_logs() as logs:
        result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2", tools=tools))
    _release_orm_thread()

    # one claim ends the run (it used to raise at every claim until it failed as too_many_claims)
    assert result is not None
    assert result.status == Run.Status.COMPLETED
    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.claims, final.error_kind) == (Run.Status.COMPLETED, 2, "")
    assert tools.calls == []  # what was committed stands: the tool is not called again
    assert _thread(run) == committed
    assert [line["run_id"] for line in logs if line["event"] == "checkpoint_unreadable"] == [str(run.pk)]
    assert asyncio.run(checkpoint_store_from_settings().get(str(run.pk))) is None  # discarded


def _release_orm_thread() -> None:
    """Close the connections of asgiref's thread, where the async ORM ran (the test database
    cannot be dropped at the end while one is open)."""
    asyncio.run(sync_to_async(connections.close_all)())


class _DiesAtTheTurnsEnd:
    """A checkpoint store whose first delete is where the worker dies (cancelled at once,
    nothing after it runs): the run is settled with its answer, its checkpoint not deleted yet."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.died = False

    async def put(self, checkpoint: Any) -> None:
        await self.store.put(checkpoint)

    async def get(self, run_id: str) -> Any:
        return await self.store.get(run_id)

    async def delete(self, run_id: str) -> None:
        if not self.died:
            self.died = True
            raise asyncio.CancelledError("the worker died here")
        await self.store.delete(run_id)


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_worker_dying_as_its_turn_ends_leaves_the_run_settled_with_its_answer(wire, monkeypatch):
    real = execution.checkpoint_store_from_settings
    dying = _DiesAtTheTurnsEnd(real())
    monkeypatch.setattr(execution, "checkpoint_store_from_settings", lambda **_: dying)
    run = lifecycle.create_run(prompt=STORY, model=MODELS[wire])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(execution.execute_run(str(run.pk)))
    assert dying.died
    # the dead worker never released its connections: do it for it
    _release_orm_thread()
    monkeypatch.setattr(execution, "checkpoint_store_from_settings", real)
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED  # settled with its answer, in one step
    assert [m["role"] for m in _thread(run)] == ["user", "assistant"]
    _assert_no_empty_assistant(_thread(run))
    assert asyncio.run(real().get(str(run.pk))) is not None  # the delete never happened: the sweep does it
    lifecycle.sweep_stale_runs()
    assert asyncio.run(real().get(str(run.pk))) is None

    calls = _provider_calls()
    assert asyncio.run(execution.execute_run(str(run.pk), worker="next:2")) is None  # settled: not run again
    assert _provider_calls() == calls
    _release_orm_thread()


class WorkerDied(BaseException):
    """Where the test kills the worker: nothing after it runs."""


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_worker_dying_between_the_answer_and_the_runs_end_leaves_nothing_half_settled(wire, monkeypatch):
    """The answer is written, then the worker dies before the run's status is: the transaction
    holding both is rolled back, the checkpoint still holds the whole answer, and the next
    worker commits it (asking the provider nothing) and completes the run."""
    real_write = lifecycle.write_messages

    def dies_after_writing(*args: Any) -> None:
        real_write(*args)
        raise WorkerDied("the worker died between the answer and the run's status")

    run = lifecycle.create_run(prompt=STORY, model=MODELS[wire])
    streamed = CollectingSink()
    monkeypatch.setattr(lifecycle, "write_messages", dies_after_writing)
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), extra_sinks=[streamed]))
    _release_orm_thread()
    monkeypatch.setattr(lifecycle, "write_messages", real_write)

    # nothing half-settled: neither the answer nor the run's end
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    assert [m["role"] for m in _thread(run)] == ["user"]
    answer = ClientView(_thread(run)).apply_all(streamed.frames).reconstructed()
    assert answer  # what the client was streamed

    _put_back(run, Run.Status.QUEUED)
    calls = _provider_calls()
    result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2"))
    _release_orm_thread()

    assert result is not None
    assert result.status == Run.Status.COMPLETED
    assert _provider_calls() == calls  # the whole answer was in the checkpoint: not asked (billed) again
    stored = _thread(run)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == answer
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    assert asyncio.run(execution.checkpoint_store_from_settings().get(str(run.pk))) is None
    _release_orm_thread()


@pytest.mark.parametrize("wire", sorted(MODELS))
def test_a_resumed_run_counts_the_turns_already_committed_against_max_turns(wire):
    run = lifecycle.create_run(prompt=WEATHER, model=MODELS[wire], demo_tools=True, engine={"max_turns": 1})
    result = asyncio.run(execution.execute_run(str(run.pk)))
    assert result is not None
    assert (result.status, (result.error or {}).get("kind")) == (Run.Status.FAILED, "max_turns")
    assert [m["role"] for m in _thread(run)] == ["user", "assistant", "user"]  # one turn and its tool results
    _put_back(run, Run.Status.QUEUED)  # as if its worker had died there

    calls = _provider_calls()
    again = asyncio.run(execution.execute_run(str(run.pk), worker="next:2"))
    _release_orm_thread()

    assert again is not None
    assert (again.status, (again.error or {}).get("kind")) == (Run.Status.FAILED, "max_turns")
    assert _provider_calls() == calls  # no second turn: MAX_TURNS is the run's, not each worker's
    assert [m["role"] for m in _thread(run)] == ["user", "assistant", "user"]


@pytest.mark.parametrize(
    ("prompt", "roles"), [(STORY, ["user", "assistant"]), (WEATHER, ["user", "assistant", "user", "assistant"])]
)
def test_each_committed_message_is_written_once_and_the_answer_with_the_runs_end(prompt, roles, monkeypatch):
    """The final answer goes in the settling transaction; the recorder, told of it afterwards as
    every sink is, does not open another to find it there. Earlier turns' messages (a tool call,
    its results) are written as they are committed."""
    from streamrecover.runs import recorder

    written: list[tuple[str, int]] = []
    real = recorder.write_messages

    def counted(rows: Any) -> None:
        written.extend((message["role"], position) for _, _, message, position in rows)
        real(rows)

    monkeypatch.setattr(recorder, "write_messages", counted)  # the recorder's (through write_message)
    monkeypatch.setattr(lifecycle, "write_messages", counted)  # the settlement's
    run = _completed(prompt, MODELS["anthropic"], demo_tools=True)
    committed = _thread(run)
    assert [m["role"] for m in committed] == roles
    assert written == [(role, position) for position, role in enumerate(roles) if position > 0]


class CancelsOnceTextArrives(CollectingSink):
    """The client that watches the run, and its user, who presses stop once text is shown."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.asked = False

    async def on_frame(self, frame: Any) -> None:
        await super().on_frame(frame)
        if frame["type"] == "text_delta" and not self.asked:
            self.asked = True
            await sync_to_async(lifecycle.request_cancel)(self.run_id, "user pressed stop")


STOPPED = "Tell me a story about the sea [[words=120]]"
CUT_SHORT = {
    # ending: (faults, engine settings, the run's status left by the dying worker)
    "exhausted": (["cut:bytes=1500", "cut:events=6", "cut:events=6"], {"max_continuations": 2}, Run.Status.QUEUED),
    "failed": (["error:events=15,type=invalid_request_error"], {}, Run.Status.QUEUED),
    "cancelled": (["stall:events=20,seconds=5"], {}, Run.Status.RUNNING),
}


@pytest.mark.parametrize("ending", sorted(CUT_SHORT))
def test_a_worker_dying_before_a_cut_short_answer_is_stored_leaves_it_to_the_next_worker(ending, monkeypatch):
    """A turn cut short (exhausted, failed, cancelled by its user) ends with the text its client
    was shown; the worker dies as that is settled. The checkpoint was deleted first, so the next
    worker asked the provider again (or, cancelled, ended the run without the text): now the
    checkpoint holds what the turn ends with until it is stored, and the next worker stores it."""
    faults, engine, left = CUT_SHORT[ending]
    real_write = lifecycle.write_messages

    def dies_after_writing(*args: Any) -> None:
        real_write(*args)
        raise WorkerDied("the worker died between the cut-short answer and the run's end")

    run = lifecycle.create_run(prompt=STOPPED, model=MODELS["anthropic"], faults=faults, engine=engine)
    watching = CancelsOnceTextArrives(str(run.pk)) if ending == "cancelled" else CollectingSink()
    monkeypatch.setattr(lifecycle, "write_messages", dies_after_writing)
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), extra_sinks=[watching]))
    _release_orm_thread()
    monkeypatch.setattr(lifecycle, "write_messages", real_write)

    assert not Run.objects.get(pk=run.pk).is_terminal  # nothing settled
    assert [m["role"] for m in _thread(run)] == ["user"]
    view = ClientView(_thread(run)).apply_all(watching.frames)
    shown = view.reconstructed()
    assert [b["type"] for b in shown] == ["text"]
    assert shown[0]["text"].strip()  # the client was shown text
    assert asyncio.run(execution.checkpoint_store_from_settings().get(str(run.pk))) is not None
    _release_orm_thread()

    _put_back(run, left)
    calls = _provider_calls()
    again = CollectingSink()
    result = asyncio.run(execution.execute_run(str(run.pk), worker="next:2", extra_sinks=[again]))
    _release_orm_thread()

    assert result is not None
    assert result.status == ending
    assert _provider_calls() == calls  # neither continued nor asked for again
    stored = _thread(run)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == shown  # exactly the text the client was shown
    view.apply_all(again.frames)  # the client that went on watching
    assert view.turns == [(shown, shown)]
    final = Run.objects.get(pk=run.pk)
    assert final.status == ending
    if ending == "cancelled":
        assert (final.error_kind, final.error_message) == ("cancel", "user pressed stop")
    assert asyncio.run(execution.checkpoint_store_from_settings().get(str(run.pk))) is None
    _release_orm_thread()


class DiesWhenAnAttemptBreaks(CollectingSink):
    """The client that watches the run, whose worker dies as its answer breaks (the text that
    arrived is checkpointed first)."""

    async def on_attempt(self, attempt: Any) -> None:
        await super().on_attempt(attempt)
        if attempt.outcome == "interrupted":
            raise WorkerDied("killed as the interrupted attempt was recorded")


def _died_mid_answer_and_swept() -> tuple[Run, ClientView]:
    """A run whose worker died as its answer broke, after its client was shown text, put back in
    the queue by the sweep; and the view of that client."""
    run = lifecycle.create_run(
        prompt=STOPPED, model=MODELS["anthropic"], faults=["error:events=12,type=overloaded_error"]
    )
    watching = DiesWhenAnAttemptBreaks()
    with pytest.raises(WorkerDied):
        asyncio.run(execution.execute_run(str(run.pk), extra_sinks=[watching]))
    _release_orm_thread()
    view = ClientView(_thread(run)).apply_all(watching.frames)
    shown = view.reconstructed()
    assert [b["type"] for b in shown] == ["text"]
    assert shown[0]["text"].strip()  # the client was shown text
    _put_back(run, Run.Status.QUEUED)  # the sweep
    return run, view


def test_a_run_cancelled_while_queued_after_its_worker_died_commits_the_text_its_client_was_shown():
    """Its worker died mid-answer, the sweep put it back in the queue, and its user pressed stop
    before a worker claimed it. Ended there and then, the run lost the text its client had been
    shown (the sweep later deleted the checkpoint that held it); left to a worker, it stayed
    ``queued`` until one was free. The process that cancels it claims it at once, already
    cancelled, and commits that text, asking the provider nothing."""
    run, view = _died_mid_answer_and_swept()
    shown = view.reconstructed()

    calls = _provider_calls()
    assert lifecycle.request_cancel(run.pk, "user pressed stop")
    for ending in starter.run_threads(run.pk):  # this process ends it, in a thread: no worker
        ending.join(timeout=30)

    assert _provider_calls() == calls  # neither continued nor asked for again
    stored = _thread(run)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == shown  # exactly the text the client was shown
    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.error_kind, final.error_message) == ("cancelled", "cancel", "user pressed stop")
    assert asyncio.run(execution.checkpoint_store_from_settings().get(str(run.pk))) is None
    assert asyncio.run(execution.execute_run(str(run.pk), worker="next:2")) is None  # a later message runs nothing
    assert _provider_calls() == calls
    _release_orm_thread()


def test_a_queued_run_that_never_started_is_still_cancelled_at_once():
    run = lifecycle.create_run(prompt=STOPPED, model=MODELS["anthropic"])
    assert lifecycle.request_cancel(run.pk, "user pressed stop")
    assert starter.run_threads(run.pk) == []  # nothing to commit: no thread claims it
    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.error_kind, final.error_message) == ("cancelled", "cancel", "user pressed stop")


@pytest.mark.parametrize("ending", ["exhausted", "failed"])
def test_a_run_whose_cut_short_answer_is_stored_is_not_requeued(ending):
    """Re-queueing (the admin's action) a run that ended exhausted or failed after its client
    was shown text: that text is the thread's last message, so executing the run again asked the
    provider nothing and called the run completed. It is left as it ended; a run that stored no
    answer is still re-queued."""
    faults, engine, _left = CUT_SHORT[ending]
    run = lifecycle.create_run(prompt=STOPPED, model=MODELS["anthropic"], faults=faults, engine=engine)
    result = asyncio.run(execution.execute_run(str(run.pk)))
    assert result is not None
    assert result.status == ending
    before = _thread(run)
    assert before[-1]["role"] == "assistant"

    assert not dispatch.requeue_run(run.pk)
    run.refresh_from_db()
    assert run.status == ending
    assert run.error_kind
    assert _thread(run) == before

    unanswered = lifecycle.create_run(
        prompt=STOPPED, model=MODELS["anthropic"], faults=["error:events=1,type=invalid_request_error"]
    )
    result = asyncio.run(execution.execute_run(str(unanswered.pk)))
    assert result is not None
    assert result.status == "failed"
    assert _thread(unanswered)[-1]["role"] == "user"
    assert lifecycle.requeue_run(unanswered.pk)  # (the lifecycle's rule: nothing is started here)
    unanswered.refresh_from_db()
    assert unanswered.status == Run.Status.QUEUED


def test_the_cancel_command_ends_a_queued_run_that_had_started_before_it_exits():
    """One-process mode: the run a cancel leaves to a worker (queued after its worker died) is
    started in a thread of the process that cancelled it. The command's process ends as soon as
    it returns, and the thread with it: the command now waits for the run's end, so the text
    its client was shown is committed and the run is cancelled when the command returns."""
    run, view = _died_mid_answer_and_swept()
    shown = view.reconstructed()

    out = io.StringIO()
    call_command("streamrecover_cancel", str(run.pk), "--reason", "user pressed stop", stdout=out)

    final = Run.objects.get(pk=run.pk)
    assert (final.status, final.error_message) == ("cancelled", "user pressed stop")
    stored = _thread(run)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == shown
    assert f"{run.pk}: cancelled" in out.getvalue()


def test_a_cut_short_run_a_follow_up_went_on_from_is_not_requeued():
    """The thread went on after the run ended failed (a follow-up message, answered): re-queued,
    the run found the follow-up's answer last, asked the provider nothing and called itself
    completed. It is left as it ended."""
    faults, engine, _left = CUT_SHORT["failed"]
    first = lifecycle.create_run(prompt=STOPPED, model=MODELS["anthropic"], faults=faults, engine=engine)
    result = asyncio.run(execution.execute_run(str(first.pk)))
    assert result is not None
    assert result.status == "failed"
    follow_up = lifecycle.create_run(prompt=STORY, model=MODELS["anthropic"], thread=first.thread)
    result = asyncio.run(execution.execute_run(str(follow_up.pk)))
    assert result is not None
    assert result.status == "completed"
    before = _thread(first)

    assert not dispatch.requeue_run(first.pk)
    first.refresh_from_db()
    assert (first.status, first.error_kind) == ("failed", "invalid_request")
    assert _thread(first) == before
