"""Claiming runs and loading what each needs to stream: one at a time, or many in one trip on a shared loop.

At a burst of run starts (a worker's slots filling at once) each run's claim was a transaction
of its own in the one thread that does every ORM call of the loop's runs: a locking read, an
update, a commit, then a query of its thread's messages; about a fifth of that thread's time at
500 streams, all of it while the other runs' frames waited for the GIL. On the shared loop a
claim is staged instead (``staged``): the claims that gathered since the flusher's last trip go
in one transaction (``lifecycle.claim_runs``: their rows locked in key order, one update of those
claimed) and their threads' messages in one query; each caller gets its own run's inputs, or
None when it was not claimed. The rules of a claim are ``lifecycle``'s, run by run, unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import Count, Q

from ..conf import app_settings
from ..engine.agent import PAUSE_TURN, ToolRegistry
from ..engine.context import Failover
from ..engine.contract import ProviderConfig
from ..models import Attempt, Message, Run
from ..providers.registry import get_adapter
from ..testing import fake_provider, is_fake
from . import lifecycle
from .staged import StagedBatches
from .tools import tools_for_run, tools_in_use

# Claims per transaction: like the attempt rows, the runs of one batch resume together, each into
# its first request and its live channel; 8 keeps the saving without a burst.
MAX_BATCH = 8
# A claimed run whose provider this process cannot reach as configured fails with this error kind.
PROVIDER_UNAVAILABLE = "provider_unavailable"
# The config of a run refused for ``provider_problem``: the run fails before any provider call,
# so its adapter is never asked anything.
NO_PROVIDER = ProviderConfig(name="anthropic", base_url="")


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a claimed run needs from the database and the settings before it streams."""

    run: Run
    messages: list[dict[str, Any]]
    consumed: int  # attempts made so far (by earlier claims)
    turns: int  # assistant turns committed so far
    config: ProviderConfig
    failover: Failover | None
    tools: ToolRegistry  # what ``STREAMRECOVER['TOOLS']`` gives the run (empty when it failed: ``tools_problem``)
    tools_problem: str  # why ``TOOLS`` gave nothing ("" when it did)
    needs_tools: frozenset[str]  # the tools the run's own messages show it was offered (``tools_in_use``)
    provider_problem: str = ""  # why this process cannot reach the run's provider ("" when it can: else NO_PROVIDER)


def provider_for_run(run: Run, consumed_attempts: int, override: ProviderConfig | None = None) -> ProviderConfig:
    """The run's provider (``override`` when given: a command line's ``--api-key``, never stored).
    The built-in fake is pointed at this process's fake server, scripted with this run's remaining
    faults: each provider call consumes one, so a resumed run does not replay spent ones."""
    config = override or app_settings.provider_config(run.provider)
    if is_fake(config):
        faults = list(run.options.get("faults") or [])[consumed_attempts:]
        config = fake_provider(config, run.model, scenario=f"run-{run.pk}", faults=faults)
    return config


def failover_for_run(run: Run) -> Failover | None:
    """A proxied run's fallback provider and model (``PROXY_FAILOVER``, fixed when it was admitted)."""
    target = (run.options.get("proxy") or {}).get("failover")
    if not target:
        return None
    config = fake_provider(app_settings.provider_config(target["provider"]), target["model"])
    extra = target.get("extra")  # a fallback of another wire format: the client's fields in its own
    return Failover(get_adapter(config), target["model"], target["provider"], extra)


def claim(run_id: str, worker: str, provider_override: ProviderConfig | None = None) -> Inputs | None:
    """The run's claim and what it needs to stream, in one hop to the ORM thread, on a connection
    that works (``close_broken_connections`` first). None when the run is not claimed."""
    (inputs,) = claim_many([run_id], worker, provider_override)
    return inputs


def claim_many(
    run_ids: Sequence[str], worker: str, provider_override: ProviderConfig | None = None
) -> list[Inputs | None]:
    """``claim`` for each of ``run_ids`` (valid run keys): the claims in one transaction, their
    threads' messages in one query; per id, in order, its inputs or None."""
    close_broken_connections()
    runs = lifecycle.claim_runs(run_ids, worker)
    claimed = [run for run in runs if run is not None]
    threads: dict[int, list[Message]] = defaultdict(list)
    if claimed:
        thread_ids = {run.thread_id for run in claimed}
        for message in Message.objects.filter(thread_id__in=thread_ids).order_by("thread_id", "position"):
            threads[message.thread_id].append(message)
    return [_inputs(run, threads[run.thread_id], provider_override) if run is not None else None for run in runs]


def _inputs(run: Run, thread: list[Message], provider_override: ProviderConfig | None) -> Inputs:
    """The claimed run's attempts and committed turns so far, its provider and failover."""
    # A first claim (epoch 1) has nothing of its own yet: attempts and answers are written
    # only under a claim, and a sweep or re-queue raises the epoch too.
    first = run.claim_epoch == 1
    consumed, turns = (0, 0) if first else _done(run, thread)
    provider_problem = ""
    try:
        config, failover = provider_for_run(run, consumed, provider_override), failover_for_run(run)
    except ImproperlyConfigured as exc:
        # This process lacks the provider's key (a worker started without the web process's
        # environment) or the provider left the settings: the run fails saying so (``execution``)
        # instead of staying claimed with nobody streaming it, and the other claims of its batch go on.
        config, failover, provider_problem = NO_PROVIDER, None, str(exc)
    messages = [message.as_canonical() for message in thread]
    tools, problem = _tools(run)
    needs = tools_in_use(run, thread)
    return Inputs(run, messages, consumed, turns, config, failover, tools, problem, needs, provider_problem)


def _done(run: Run, thread: list[Message]) -> tuple[int, int]:
    """The attempts an earlier claim of ``run`` made, and the requests of its committed turns:
    each answer committed, plus each time the provider paused one of those turns (a paused turn
    is one message, but every request of it counted against ``max_turns``). The pauses are its
    attempts' stop reasons, the turn it goes on with left out: that turn's checkpoint counts its
    own (``Checkpoint.pauses``)."""
    answers = [m for m in thread if m.role == Message.Role.ASSISTANT]
    going_on = len(answers)  # the turn index (``Attempt.turn``) the run goes on with
    counts = Attempt.objects.filter(run=run).aggregate(
        made=Count("pk"), paused=Count("pk", filter=Q(turn__lt=going_on, stop_reason=PAUSE_TURN))
    )
    committed = sum(1 for m in answers if m.run_id == run.pk)
    return counts["made"], committed + counts["paused"]


def _tools(run: Run) -> tuple[ToolRegistry, str]:
    """The run's tools, here in the ORM's thread (a host's function may query); a function that
    raises fails this run (``execution``), never the other claims of its batch."""
    try:
        return tools_for_run(run), ""
    except Exception as exc:
        return ToolRegistry(), f"{type(exc).__name__}: {exc}"


def close_broken_connections() -> None:
    """Close this thread's connections that no longer work (never one inside a transaction:
    a caller's atomic block is left alone); the next query opens a fresh one."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
            connection.close()


@dataclass(frozen=True, slots=True)
class _Claim:
    run_id: str
    worker: str


class RunClaims(StagedBatches[_Claim, "Inputs | None"]):
    """One per event loop: ``claim`` stages a run's claim and waits for its own inputs (or None)."""

    max_batch = MAX_BATCH
    # A claimed run starts streaming once told: one back per loop turn, not the batch at once.
    one_per_turn = True

    async def claim(self, run_id: str, worker: str) -> Inputs | None:
        """The run's inputs once claimed, None when it is not; ``ValidationError`` for an id
        that is no run's key (it never reaches, nor fails, the other runs' batch)."""
        lifecycle.run_key(run_id)
        return await self._stage(_Claim(run_id, worker))

    async def _send(self, items: Sequence[_Claim]) -> list[Inputs | BaseException | None]:
        by_worker: dict[str, list[int]] = defaultdict(list)  # one worker id per process, in practice
        for index, item in enumerate(items):
            by_worker[item.worker].append(index)
        results: list[Inputs | BaseException | None] = [None] * len(items)
        for worker, indexes in by_worker.items():
            claimed = await sync_to_async(claim_many)([items[i].run_id for i in indexes], worker)
            for index, inputs in zip(indexes, claimed, strict=True):
                results[index] = inputs
        return results
