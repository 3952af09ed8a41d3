"""The agent loop: a run's assistant turns, and the tools their completed tool calls ask for.

Each completed tool call (including one salvaged by R2) is executed at most once per
committed assistant message: its result is stored (``RunContext.tool_results``) as soon as the
call returns, and a resumed run reuses a stored result instead of calling the tool again. The
results are committed as the next user message before the next turn starts. A synchronous
tool runs in a worker thread, so a tool that blocks never stops the event loop (the run's
heartbeat goes on); a tool that takes a ``context`` argument gets the call's
``ToolCallContext`` with its idempotency key, the same however often the call is made (a
worker that dies during the call leaves no result, and the next one calls it again).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .blocks import Block
from .context import RunContext, Settlement
from .contract import ModelRequest, ToolSpec
from .notices import ToolNotice, notice_blocks
from .protocol import FrameKind, RunStatus
from .toolresults import ToolCallContext
from .transport import HttpxTransport
from .turn import TurnResult, TurnRunner

# Anthropic's stop reason for a long server-tool turn it paused: the turn goes on when its
# answer so far is sent back as the last assistant message
PAUSE_TURN = "pause_turn"

# ``func(input)``, or ``func(input, context=ToolCallContext)`` when it has a ``context`` parameter
ToolFunc = Callable[..., Any] | Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    func: ToolFunc

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.input_schema)

    @property
    def takes_context(self) -> bool:
        try:
            return "context" in inspect.signature(self.func).parameters
        except (TypeError, ValueError):
            return False

    async def call(self, arguments: dict[str, Any], context: ToolCallContext | None) -> Any:
        """Call the function: a coroutine function on the event loop, anything else in a thread."""
        kwargs = {"context": context} if context is not None and self.takes_context else {}
        if inspect.iscoroutinefunction(self.func):
            value = await self.func(arguments, **kwargs)
        else:
            value = await asyncio.to_thread(self.func, arguments, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value


class ToolRegistry:
    """Python callables the model may call, each with a JSON schema for its input."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {t.name: t for t in tools or []}
        self.calls: list[tuple[str, dict[str, Any]]] = []  # every execution, in order

    def register(
        self, func: ToolFunc, *, name: str | None = None, description: str = "", input_schema: dict[str, Any]
    ) -> Tool:
        tool = Tool(name or func.__name__, description or (func.__doc__ or "").strip(), input_schema, func)
        self._tools[tool.name] = tool
        return tool

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in self._tools.values())

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    async def execute(self, call: dict[str, Any], context: ToolCallContext | None = None) -> dict[str, Any]:
        """Run one canonical tool_use block; always returns a canonical tool_result block."""
        name = call.get("name") or ""
        tool = self._tools.get(name)
        self.calls.append((name, call.get("input") or {}))
        if tool is None:
            return _result(call, f"unknown tool {name!r}; available: {sorted(self._tools)}", True)
        try:
            value = await tool.call(call.get("input") or {}, context)
        except Exception as exc:  # a tool error is the model's to handle
            return _result(call, f"{type(exc).__name__}: {exc}", True)
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return _result(call, text, False)


def _result(call: dict[str, Any], content: str, is_error: bool) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call.get("id"), "content": content, "is_error": is_error}


@dataclass(slots=True)
class RunResult:
    status: str  # completed, failed, exhausted, cancelled
    messages: list[dict[str, Any]]  # the whole thread after the run
    new_messages: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, str] | None = None
    turns: int = 0
    continuations: int = 0
    recovered: bool = False
    seq: int = 0
    # NOTIFY_MODEL_OF_DISCARDED_TOOLS notices that no tool-results message of this run carried
    # (the turn with the discarded call ended without tools to run): they belong in the
    # thread's next user message, which the caller commits.
    undelivered_notices: list[ToolNotice] = field(default_factory=list)
    settled: bool = False  # the run's end (and final answer) were stored through ``RunContext.settle``


async def run_agent(
    ctx: RunContext,
    request: ModelRequest,
    *,
    tools: ToolRegistry | None = None,
    resume: bool = False,
    one_turn: bool = False,
    refusal: dict[str, str] | None = None,
) -> RunResult:
    """Run turns until the model stops asking for tools, a turn fails, or ``max_turns``.

    ``ctx`` is the run's context, built once by the caller (its ``seq`` and ``attempts``
    number on after what an earlier process of the same run published and recorded).
    ``request.messages`` is the committed thread (ending with the user's message, or with
    an assistant message whose tool calls still need results, or a tool-result message).
    With ``resume``, a fresh checkpoint for the run continues the turn it belongs to.
    With ``one_turn`` the caller runs the tools (a proxied request: the client does): one
    assistant turn, and no tool call is executed here.
    With ``refusal`` (the caller found the run cannot go on: a tool its conversation already
    used is not in ``tools``) the run fails with that error before any provider call or tool.
    """
    config, sink, checkpoints, cancel = ctx.config, ctx.sink, ctx.checkpoints, ctx.cancel
    cancel.bind()
    tools = tools or ToolRegistry()
    if tools.specs() and not request.tools:
        request = replace(request, tools=tools.specs())
    own_transport = ctx.transport is None
    if ctx.transport is None:
        ctx.transport = HttpxTransport()
    transport = ctx.transport
    messages = [dict(m) for m in request.messages]
    new_messages: list[dict[str, Any]] = []
    # turns an earlier process of this run committed count against ``max_turns`` too
    result = RunResult(RunStatus.COMPLETED, messages, turns=ctx.turns)

    async def commit(message: dict[str, Any]) -> None:
        messages.append(message)
        new_messages.append(message)
        await sink.on_message(message, len(messages) - 1)
        await ctx.frame(FrameKind.MESSAGE_COMMITTED, position=len(messages) - 1, message=message)

    resume_checkpoint = None
    if resume:
        found = await checkpoints.get(ctx.run_id)
        if found is not None:
            if found.is_fresh(config.checkpoint_ttl_s) and found.history_len == len(messages):
                resume_checkpoint = found
                ctx.seq = max(ctx.seq, found.seq)
            else:
                await checkpoints.delete(ctx.run_id)
    # how often the provider paused the turn now running: a turn it paused before this process
    # took the run over made as many requests more than its own (the last) one, which count
    # against max_turns as the committed turns do
    pauses = resume_checkpoint.pauses if resume_checkpoint is not None else 0
    result.turns += pauses

    notices: list[ToolNotice] = []
    final: dict[str, Any] | None = None  # the final answer, committed with the run's end (ctx.settle)
    settling: TurnRunner | None = None  # the turn whose checkpoint goes once what it ended with is stored
    # The answer so far of a turn the provider paused (``pause_turn``), numbered as the client
    # holds it: the next request sends it back for the model to go on. Never committed alone:
    # the turn's answer is one assistant message, as unpaused.
    paused: list[Block] = []
    try:
        reclaimed = ctx.seq > 0 and resume_checkpoint is None
        await ctx.frame(FrameKind.RUN_STATUS, status=RunStatus.RUNNING)
        if reclaimed:
            # An earlier process of this run streamed blocks its clients still show, and no
            # checkpoint kept them: the turn starts over, so they go (a resume resets its own).
            await ctx.frame(FrameKind.STREAM_RESET, reason="reclaimed")
        turn = _turn_index(messages)
        if refusal is not None:
            result.status = RunStatus.FAILED
            result.error = dict(refusal)
        while refusal is None:
            stop: tuple[str, dict[str, str]] | None = None
            outcome: TurnResult
            if cancel.stopped and resume_checkpoint is None:
                # (a turn left in a checkpoint ends with what its client was shown: ``TurnRunner``)
                stop = RunStatus.CANCELLED, {"kind": cancel.kind or "cancel", "message": cancel.reason}
            elif paused and result.turns >= config.max_turns:
                stop = RunStatus.FAILED, _paused_too_often(config.max_turns)
            if stop is not None and paused:
                # a paused answer not gone on with ends as any answer cut short: what it showed
                # that history takes is committed, the rest dropped (a server tool call never run)
                runner = TurnRunner(ctx, _with_messages(request, messages), turn, len(messages), paused, pauses)
                paused = []
                outcome = await runner.endings.end_short(*stop)
                result.status, result.error = outcome.status, outcome.error
                final, settling = await _end_cut_short(ctx, runner, outcome, commit)
                break
            if stop is not None:
                result.status, result.error = stop
                break
            pending = pending_tool_calls(messages)
            if pending and not one_turn:
                await commit(await _execute_tools(ctx, len(messages) - 1, pending, tools, notices))
                notices = []
                continue
            if messages and messages[-1].get("role") == "assistant" and not one_turn:
                # The thread already ends with the answer (a run re-executed after its final
                # commit): asking again would only add an empty assistant message. (A paused
                # answer is never committed alone: ``paused``.) A one-turn run's thread is its
                # client's request, whose last assistant message is the client's own (a prefill,
                # or a turn the provider paused, sent back): the answer goes on from it. Its own
                # answer is committed with its end (``ctx.settle``), after which it never runs again.
                break
            if result.turns >= config.max_turns:
                result.status = RunStatus.FAILED
                result.error = {"kind": "max_turns", "message": f"stopped after {config.max_turns} assistant turns"}
                break
            turn_request = _with_messages(request, messages)
            runner = TurnRunner(ctx, turn_request, turn, len(messages), paused, pauses)
            paused = []
            outcome = await runner.run(resume_checkpoint)
            resume_checkpoint = None
            result.turns += 1
            result.continuations += outcome.continuations
            result.recovered = result.recovered or outcome.recovered
            if outcome.status != RunStatus.COMPLETED:
                result.status = outcome.status
                result.error = outcome.error
                final, settling = await _end_cut_short(ctx, runner, outcome, commit)
                break
            if config.notify_model_of_discarded_tools:
                notices.extend(outcome.discarded_tools)
            if outcome.stop_reason == PAUSE_TURN and outcome.blocks and not one_turn:
                # The provider paused a long server-tool turn: the next request sends the answer
                # so far back as it is, and the model goes on with the same turn (each request
                # counts against max_turns). The turn's checkpoint, holding that answer, stays:
                # a worker dying before the next request leaves it to the next one.
                paused = outcome.numbered
                pauses += 1
                continue
            # one_turn (the healing endpoint): the client runs the tools, the run is this one answer
            last = (
                one_turn
                or outcome.stop_reason != "tool_use"
                or not any(b.get("type") == "tool_use" for b in outcome.blocks)
            )
            if last and ctx.settle is not None:
                # The run's last answer is committed with the run's end, in one step (below).
                final = {"role": "assistant", "content": outcome.blocks} if outcome.blocks else None
                settling = runner
                break
            if outcome.blocks:
                await commit({"role": "assistant", "content": outcome.blocks})
            # else: an answer with no content (a stream that ended with nothing, a refusal before
            # any text) is not committed: providers reject an empty assistant message in history.
            # The checkpoint goes only once the answer is committed: a worker dying in between
            # leaves a checkpoint that no longer matches the history, which a resume discards.
            await runner.settled()
            turn += 1
            pauses = 0
            if last:
                break
        if ctx.settle is not None:
            await ctx.settle(Settlement(result.status, result.error, final, len(messages), list(notices)))
            result.settled = True
            if final is not None:
                # committed now: every sink hears of it as of any message (a store finds it there)
                await commit(final)
            if settling is not None:
                await settling.settled()
        await ctx.frame(FrameKind.RUN_STATUS, status=result.status, error=result.error)
    finally:
        if own_transport:
            await transport.__aexit__(None, None, None)
            ctx.transport = None
    result.messages = messages
    result.new_messages = new_messages
    result.seq = ctx.seq
    result.undelivered_notices = notices
    return result


CommitMessage = Callable[[dict[str, Any]], Awaitable[None]]


async def _end_cut_short(
    ctx: RunContext, runner: TurnRunner, outcome: TurnResult, commit: CommitMessage
) -> tuple[dict[str, Any] | None, TurnRunner | None]:
    """What the client was shown of an answer cut short (exhausted, cancelled, failed) is
    committed as it was shown: the run's end says it was cut short. As for an answer, the turn's
    checkpoint goes only once that is committed. Returns the final message and the turn still
    to settle when the run's end commits them (``ctx.settle``)."""
    cut = {"role": "assistant", "content": outcome.blocks} if outcome.blocks else None
    if ctx.settle is not None:
        return cut, runner
    if cut is not None:
        await commit(cut)
    await runner.settled()
    return None, None


def _paused_too_often(max_turns: int) -> dict[str, str]:
    return {
        "kind": "max_turns",
        "message": f"stopped after {max_turns} assistant turns: the provider paused the last one (pause_turn)",
    }


def _turn_index(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def _with_messages(request: ModelRequest, messages: list[dict[str, Any]]) -> ModelRequest:
    return replace(request, messages=list(messages))


def pending_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls of the last assistant message that have no result yet."""
    if not messages or messages[-1].get("role") != "assistant":
        return []
    return [b for b in messages[-1].get("content", []) if b.get("type") == "tool_use"]


async def _execute_tools(
    ctx: RunContext, position: int, calls: list[dict[str, Any]], tools: ToolRegistry, notices: list[ToolNotice]
) -> dict[str, Any]:
    """The user message with every call's result, plus (when enabled) an explicit notice of
    tool calls that were cut off and never executed. ``position`` is the assistant message's
    that made the calls. A result already stored (a resumed run) is used as it is; a new one
    is stored before the next call is made."""
    content: list[dict[str, Any]] = []
    for call in calls:
        call_id = str(call.get("id") or "")
        result = await ctx.tool_results.get(ctx.run_id, position, call_id)
        if result is None:
            # the last check before the call: a worker fenced out of the run meanwhile stops here
            await ctx.tool_results.before_call(ctx.run_id, position, call_id)
            result = await tools.execute(call, ToolCallContext.for_call(ctx.run_id, position, call_id))
            await ctx.tool_results.put(ctx.run_id, position, call_id, result)
        content.append(result)
    return {"role": "user", "content": content + notice_blocks(notices)}
