"""The load and the chaos: runs started through the HTTP API, a WebSocket client per run, and
the monkey that kills workers, restarts Redis and terminates PostgreSQL connections meanwhile.

A client is the reference client (``streamrecover.testing.client.ClientView``) fed by a real
WebSocket and doing what the browser's client does: on a seq gap it asks for a snapshot
(``resync``); when its socket breaks or stays silent it reconnects with ``?after=`` its last
frame; until it has seen the run end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from streamrecover.testing.client import ClientView

from .plan import RunSpec
from .stack import Database, Stack

TERMINAL = frozenset({"completed", "failed", "exhausted", "cancelled"})


@dataclass
class Watched:
    """What one WebSocket client saw of one run."""

    run_id: str
    view: ClientView = field(default_factory=ClientView)
    connects: int = 0
    errors: list[str] = field(default_factory=list)
    frames: list[dict[str, Any]] = field(default_factory=list)  # as received (with a marker per connect)
    resyncs: int = 0

    @property
    def status(self) -> str | None:
        return self.view.status


@dataclass
class ChaosLog:
    """What the monkey did, with times (``time.time()``) for the evidence."""

    worker_kills: list[tuple[float, str, int]] = field(default_factory=list)  # (when, worker, pid)
    redis_restarts: list[float] = field(default_factory=list)
    pg_terminated: list[tuple[float, int]] = field(default_factory=list)


class Session:
    """A logged-in user's cookies and the CSRF pair Django checks on the API's POSTs."""

    def __init__(self, session_key: str) -> None:
        self.csrf = secrets.token_hex(16)  # 32 characters: a valid unmasked token
        self.cookie = f"sessionid={session_key}; csrftoken={self.csrf}"

    def headers(self, origin: str) -> dict[str, str]:
        return {"Cookie": self.cookie, "X-CSRFToken": self.csrf, "Origin": origin, "Referer": origin + "/"}


async def start_run(client: httpx.AsyncClient, stack: Stack, session: Session, spec: RunSpec) -> dict[str, Any]:
    """``POST api/runs/``; a connection broken by the chaos is tried again (the run is created once:
    a retry only follows a failure before any answer)."""
    for attempt in range(20):
        try:
            response = await client.post(
                f"{stack.web_url}/streamrecover/api/runs/", json=spec.body(), headers=session.headers(stack.web_url)
            )
        except httpx.TransportError:
            await asyncio.sleep(0.5)
            continue
        if response.status_code == 201:
            return dict(response.json())
        if response.status_code >= 500 and attempt < 19:
            await asyncio.sleep(0.5)  # the database or Redis was being broken: the API refused cleanly
            continue
        raise RuntimeError(f"starting {spec.tag}: HTTP {response.status_code} {response.text[:300]}")
    raise RuntimeError(f"starting {spec.tag}: no answer")


async def watch(
    stack: Stack, session: Session, watched: Watched, ws_path: str, deadline: float, delay: float = 0.0
) -> None:
    """Follow one run over its WebSocket until it ends (or ``deadline``, monotonic); what the
    client saw is in ``watched`` even when the task is cancelled. ``delay``: when to connect
    first (clients arriving together would all queue on the server's one database thread)."""
    await asyncio.sleep(delay)
    ws_base = stack.web_url.replace("http://", "ws://")
    pause = 0.25  # the browser client's reconnect backoff: 0.25 s doubling to 8 s, with jitter
    while time.monotonic() < deadline and watched.status not in TERMINAL:
        after = f"?after={watched.view.last_seq}" if watched.view.last_seq else ""
        try:
            async with websockets.connect(
                ws_base + ws_path + after,
                additional_headers={"Cookie": session.cookie},
                origin=stack.web_url,  # type: ignore[arg-type]
                open_timeout=30,
                close_timeout=1,
                max_size=None,
            ) as socket:
                watched.connects += 1
                pause = 0.25
                watched.frames.append({"type": "_connected", "after": watched.view.last_seq})
                waiting_for_snapshot = False
                while watched.status not in TERMINAL:
                    raw = await asyncio.wait_for(socket.recv(), timeout=30)
                    frame = json.loads(raw)
                    watched.frames.append(frame)
                    if frame.get("type") == "error":
                        watched.errors.append(f"{frame.get('code')}: {frame.get('message')}")
                        continue
                    if frame.get("type") == "snapshot":
                        waiting_for_snapshot = False
                    elif waiting_for_snapshot:
                        continue
                    elif frame.get("first_seq", frame.get("seq")) != watched.view.last_seq + 1:
                        # a gap: what the browser's client does, ask for a snapshot and wait for it
                        watched.resyncs += 1
                        waiting_for_snapshot = True
                        await socket.send(json.dumps({"type": "resync"}))
                        continue
                    watched.view.apply(frame)
        except (TimeoutError, OSError, websockets.WebSocketException):
            pass  # silent or broken: reconnect from the last frame applied
        except Exception as exc:  # the client's own failure: recorded as evidence, then it starts over
            watched.errors.append(f"{type(exc).__name__}: {exc}")
            watched.view = ClientView()
        await asyncio.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, 8.0)


async def monkey(
    stack: Stack,
    database: Database,
    log: ChaosLog,
    rng: random.Random,
    stop: asyncio.Event,
    *,
    kill_every: float,
    max_kills: int | None,
    redis_restarts: int,
    pg_every: float,
    harness_application: str,
) -> None:
    """Until ``stop``: SIGKILL a random worker (and start it again) every ``kill_every`` seconds,
    terminate the database's other connections every ``pg_every`` seconds, and restart Redis
    ``redis_restarts`` times, spread over the first minute."""
    started = time.monotonic()
    next_kill = started + kill_every
    next_pg = started + pg_every
    redis_at = [started + 6 + i * 15 for i in range(redis_restarts)]
    while not stop.is_set():
        now = time.monotonic()
        ready = stack.ready_workers()
        # one worker down at a time: the others keep executing while it boots again
        can_kill = kill_every > 0 and len(ready) == len(stack.workers)
        if can_kill and now >= next_kill and (max_kills is None or len(log.worker_kills) < max_kills):
            worker = rng.choice(ready)
            log.worker_kills.append((time.time(), worker.name, worker.pid))
            await asyncio.to_thread(stack.restart_worker, worker)
            next_kill = time.monotonic() + kill_every * rng.uniform(0.5, 1.5)
        if pg_every > 0 and now >= next_pg:
            count = await asyncio.to_thread(database.terminate_others, harness_application)
            log.pg_terminated.append((time.time(), count))
            next_pg = time.monotonic() + pg_every * rng.uniform(0.5, 1.5)
        if redis_at and now >= redis_at[0]:
            redis_at.pop(0)
            log.redis_restarts.append(time.time())
            await asyncio.to_thread(stack.restart_redis, 1.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.25)
