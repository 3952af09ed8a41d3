"""The tools a run offers the model (``STREAMRECOVER['TOOLS']``) and those its stored conversation needs."""

from __future__ import annotations

from collections.abc import Sequence

from ..conf import app_settings, import_tools
from ..engine.agent import ToolRegistry
from ..models import Message, Run

# The error kind of a run that cannot go on without a tool its conversation already used.
TOOL_UNAVAILABLE = "tool_unavailable"


def tools_for_run(run: Run) -> ToolRegistry:
    """The registry ``TOOLS`` gives this run (none: an empty one). Called in the ORM's thread, so
    a host's function may read the run's owner or thread; it raises ``ImproperlyConfigured`` when
    the setting does not import, and ``TypeError`` when the function gives something else than a
    registry. A proxied run offers only what its client sent: the host's tools are never added
    to it (nor asked for, so a failing function never fails it)."""
    path = app_settings.TOOLS
    if path is None or run.options.get("proxy"):
        return ToolRegistry()
    source = import_tools(path)
    registry = source if isinstance(source, ToolRegistry) else source(run)
    if registry is None:
        return ToolRegistry()
    if not isinstance(registry, ToolRegistry):
        raise TypeError(f"STREAMRECOVER['TOOLS'] ({path}) gave a {type(registry).__name__}, not a ToolRegistry")
    return registry


def tools_in_use(run: Run, thread: Sequence[Message]) -> frozenset[str]:
    """The tools this run's own messages show it was offered: a call still waiting for its result
    (committed by a claim that died during the call) and a call whose result was not an error.

    A call that got an error result may have named a tool that never existed (a model's mistake,
    told to the model); it says nothing of what the run was offered. A proxied run's tools are its
    client's to run, never this process's.
    """
    if run.options.get("proxy"):
        return frozenset()
    own = [message for message in thread if message.run_id == run.pk]
    errors = {
        block.get("tool_use_id"): bool(block.get("is_error"))
        for message in own
        if message.role == Message.Role.USER
        for block in message.content
        if isinstance(block, dict) and block.get("type") == "tool_result"
    }
    return frozenset(
        str(block.get("name") or "")
        for message in own
        if message.role == Message.Role.ASSISTANT
        for block in message.content
        if isinstance(block, dict) and block.get("type") == "tool_use" and not errors.get(block.get("id"), False)
    )


def unavailable_tools_error(needed: frozenset[str], tools: ToolRegistry) -> dict[str, str] | None:
    """The run's error when its conversation used a tool ``tools`` lacks (None: nothing missing)."""
    missing = sorted(name for name in needed if name not in tools)
    if not missing:
        return None
    return {
        "kind": TOOL_UNAVAILABLE,
        "message": (
            f"this run already used the tool(s) {', '.join(map(repr, missing))}, which this process does not "
            "offer (STREAMRECOVER['TOOLS']): the run is not continued without them"
        ),
    }
