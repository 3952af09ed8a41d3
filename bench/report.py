"""``make bench``: run every benchmark and write ``BENCHMARKS.md`` at the repository root.

Sections: live delivery (``bench.bench_delivery``: the two goal loads, the per-token
``group_send`` baseline on the core channels_redis layer in the same run, a load with cut
streams; beside its memory per stream, the floor of any stream: ``bench.bench_floor``),
recovery overhead and billing (``bench.bench_recovery``), parsing (``bench.bench_parse``),
what a worker holds for a run's text (``bench.bench_textmem``).
Each figure is given with its anchor (a goal, the baseline, the SDK) and their ratio, and
with the load average seen while it was measured: the machine may be shared. A section not
run this time (``--only``) keeps its previous text from the file. The analytics bench takes
a generated history of a million events and is run on its own (``make bench-analytics``);
its section is kept as last written.

``--quick`` runs every bench with tiny parameters (the CI smoke run) and writes nothing
unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "BENCHMARKS.md"
SECTIONS = ("delivery", "recovery", "parse", "text", "analytics")


def _versions() -> str:
    import channels
    import channels_redis
    import daphne
    import django
    import httpx
    import redis

    names = {
        "CPython": platform.python_version(),
        "Django": django.__version__,
        "channels": channels.__version__,
        "channels-redis": channels_redis.__version__,
        "Daphne": daphne.__version__,
        "httpx": httpx.__version__,
        "redis-py": redis.__version__,
    }
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
        version = re.search(r"v=(\S+)", out)
        names["Redis"] = version.group(1) if version else "?"
    except OSError:
        names["Redis"] = "?"
    try:
        import psycopg

        with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres") as conn:
            row = conn.execute("SHOW server_version").fetchone()
            names["PostgreSQL"] = str(row[0]).split()[0] if row else "?"
    except Exception:
        names["PostgreSQL"] = "?"
    return ", ".join(f"{k} {v}" for k, v in names.items())


def _machine() -> str:
    import psutil

    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} cores, {memory:.1f} GiB RAM, {platform.machine()}, {platform.system()} {platform.release()}"
    )


def _now() -> str:
    """When a section was measured: a section not re-run keeps its own."""
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"


def _ratio(value: float, anchor: float) -> str:
    if not anchor or value != value or anchor != anchor:
        return "–"
    return f"{value / anchor:.2f}×"


def _cmp(label: str, now: float, anchor: float, fmt: str = "{:,.0f}", unit: str = "") -> str:
    """A table row: the figure, its anchor and their ratio."""
    return f"| {label} | {fmt.format(now)}{unit} | {fmt.format(anchor)}{unit} | {_ratio(now, anchor)} |"


def _ok(met: bool) -> str:
    return "**met**" if met else "**not met**"


# ---- delivery ---------------------------------------------------------------------------------

# The pipeline before this design (a thread and an event loop per run, two awaited Redis round
# trips per frame, a cancel query per run four times a second), measured with this bench on
# 2026-11-30 at commit 202b999, 100 streams x 30 deltas/s, load average 0.7 -> 3.4.
BEFORE = {
    "received": 2717,
    "offered": 3000,
    "publish_p99": 723.3,
    "first_p99": 759.7,
    "worker_us": 718,
    "daphne_us": 161,
    "memory_kib": 1342,
}


PHASES = ("start", "steady", "end")
SETTLE_LOAD = 1.0  # the 1-minute load average a configuration waits for (at most SETTLE_MAX_S)
SETTLE_MAX_S = 90.0


def _settle() -> float:
    """Wait until the machine has calmed down after the previous configuration (its processes'
    exit, the database's autovacuum of the rows it wrote): each configuration starts from about
    the same quiet machine, not from where the one before it left it (run right after the
    others, 500 x 10/s measured a p99 of 156 and 270 ms in two reports; runs of it alone the
    same hour were mostly under 150 ms: docs/delivery.md gives the spread)."""
    start = time.monotonic()
    while os.getloadavg()[0] > SETTLE_LOAD and time.monotonic() - start < SETTLE_MAX_S:
        time.sleep(2)
    return time.monotonic() - start


def delivery(quick: bool) -> str:
    from bench import bench_delivery as bd

    bd.setup()
    logs = Path("/tmp") / f"streamrecover-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    keys = ("100x30", "baseline", "faults", "500x10")
    results: dict[str, dict[str, Any]] = {}
    for number, key in enumerate(keys):
        config = bd.CONFIGS[key]
        if quick:
            config = replace(config, runs=4 if key != "500x10" else 6, words=20)
        if number and not quick:
            waited = _settle()
            print(f"-- settled for {waited:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
        print(f"-- delivery: {config.name} ({config.runs} streams)", flush=True)
        # The per-token baseline may not keep up at all: it gets as long as the streams need
        # at their pace plus a margin, then what arrived is measured and the rest counted.
        limit = 4 * config.words * config.event_delay + 120
        results[key] = bd.run_config(config, logs, drive_timeout_s=limit)
        print(bd.row(results[key]), flush=True)
        for line in results[key]["stuck"]:
            print(f"   ended early: {line}", flush=True)
    main, base, faults = results["100x30"], results["baseline"], results["faults"]

    lines = [bd.HEADER, *(bd.row(results[k]) for k in keys), ""]
    goals = []
    for key, p99_goal in (("100x30", 50.0), ("500x10", 150.0)):
        r = results[key]
        first_goal = 100.0
        done = r["completeness"]
        goals.append(
            f"| {r['config'].name} | {100 * done:.0f}% of offered (goal ≥ 95%: {_ok(done >= 0.95)}) "
            f"| {r['publish_ms']['p99']:.0f} ms (goal ≤ {p99_goal:.0f}: {_ok(r['publish_ms']['p99'] <= p99_goal)}, "
            f"{_ratio(r['publish_ms']['p99'], p99_goal)}) "
            f"| {r['first_delta_ms']['p99']:.0f} ms"
            + (
                f" (goal ≤ {first_goal:.0f}: {_ok(r['first_delta_ms']['p99'] <= first_goal)})"
                if key == "100x30"
                else ""
            )
            + f" | {r['mismatches']} | {r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |"
        )
    phases = []
    for key in ("100x30", "500x10"):
        r = results[key]
        by_phase = r["publish_ms_by_phase"]
        phases.append(
            f"| {r['config'].name} | "
            + " | ".join(f"{by_phase[name]['p50']:.1f} / {by_phase[name]['p99']:.1f} ms" for name in PHASES)
            + " |"
        )
    memory = []
    for key in ("100x30", "500x10"):
        r = results[key]
        per = r["memory_per_stream_bytes"]
        text = r["text_bytes_per_run"]
        memory.append(
            f"| {r['config'].name} | {per / 1024:.0f} KiB | {text:,.0f} B | {_ratio(per, 2 * text)} of the goal "
            f"(2 × text: {_ok(per <= 2 * text)}) | {r['checkpoint_writes_per_run_s']:.2f} "
            f"(goal ≤ 4: {_ok(r['checkpoint_writes_per_run_s'] <= 4)}) | {r['frames_per_redis_call']:.1f} "
            f"| {bd.gc_summary(r['worker_gc'])} "
            f"| {r['rss_base_mib']:.0f} → "
            f"{r['rss_peak_mib']:.0f} MiB |"
        )
    if not quick:
        waited = _settle()
        print(f"-- settled for {waited:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
    print("-- the floor of a stream", flush=True)
    floor = stream_floor(
        {results[k]["config"].runs: results[k]["text_bytes_per_run"] for k in ("100x30", "500x10")}, quick
    )
    per_delta = main["worker_us_per_delta"] + main["daphne_us_per_delta"]
    # Every process's CPU per delivered delta (the whole pipeline on this one host), and the
    # rate two otherwise idle cores could sustain at that cost: an estimate, said as one.
    capacity = []
    for key in ("100x30", "500x10"):
        r = results[key]
        whole = 1e6 * sum(r["cpu_s"].values()) / max(1, r["deltas"])
        sustainable = 2e6 / whole if whole else float("nan")
        capacity.append(
            f"| {r['config'].name} | {whole:.0f} µs | {sustainable:,.0f} deltas/s "
            f"| {r['offered_per_s']:,.0f} deltas/s | {_ratio(sustainable, r['offered_per_s'])} |"
        )
    base_per_delta = base["worker_us_per_delta"] + base["daphne_us_per_delta"]
    baseline = "\n".join(
        [
            _cmp("deltas/s received", main["received_per_s"], base["received_per_s"]),
            _cmp("publish→client p99", main["publish_ms"]["p99"], base["publish_ms"]["p99"], unit=" ms"),
            _cmp("worker + Daphne CPU per delta", per_delta, base_per_delta, unit=" µs"),
        ]
    )
    before = "\n".join(
        [
            _cmp("deltas/s received", main["received_per_s"], BEFORE["received"]),
            _cmp("publish→client p99", main["publish_ms"]["p99"], BEFORE["publish_p99"], unit=" ms"),
            _cmp("first delta→client p99", main["first_delta_ms"]["p99"], BEFORE["first_p99"], unit=" ms"),
            _cmp("worker CPU per delta", main["worker_us_per_delta"], BEFORE["worker_us"], unit=" µs"),
            _cmp("Daphne CPU per delta", main["daphne_us_per_delta"], BEFORE["daphne_us"], unit=" µs"),
            _cmp("worker memory per stream", main["memory_per_stream_bytes"] / 1024, BEFORE["memory_kib"], unit=" KiB"),
        ]
    )
    text = f"""## Live delivery

Measured {_now()}.

`python -m bench.bench_delivery --only 100x30,baseline,faults,500x10`. Everything runs on this one
machine, each in its own process as in production: PostgreSQL, Redis, the fake provider
(`manage.py streamrecover_fake_provider`, pacing its SSE events: 30/s or 10/s per stream), one
Daphne, the Celery worker(s) (threads pool of 16; a run holds no thread once claimed, every run on the worker's
shared event loop), and the bench process as the WebSocket clients. Every client connects before
its run starts and reads to the final `run_status`.

* **deltas/s received / offered**: each stream's deltas over its own span at the client, summed
  over the streams, against streams × the provider's rate.
* **publish→client**: the frame's publish time in the worker (`debug_ts.out`) to the client's
  receive. **first delta→client**: when the frame's first delta reached the publisher
  (`debug_ts.in`) to the receive; adds the coalescing window (25 ms).
* **CPU s** per process over the measured phase (psutil); **µs/delta**: that CPU over the
  deltas delivered. Redis is the machine's shared server: its figure includes whatever else
  used it at the time. PG counts the backends of the bench's database only.
* **rebuild mismatches**: runs whose client-side reconstruction (`testing.client.ClientView`)
  differs from the committed messages, among the clients that saw their run end. Must be 0.
  Each client does what the browser's does on a seq gap (frames lost on the way): it asks for
  a snapshot (`resync`); "clients resynced" counts those that had to. The core channels_redis
  layer drops a `group_send` message to a channel that already holds its capacity (100 by
  default), so the per-token baseline loses frames once its consumers fall behind; its
  mismatches are among those clients.
  "clients without the run's end": clients whose socket the server closed, or that had not
  seen their run end (in a `run_status` frame or a snapshot) within the bench's time limit
  (4 × the stream's nominal length + 2 min): a load the host did not carry, or frames lost.
* **load avg**: the 1-minute load average before and after: **this machine was shared with
  other work during the measurements** (other jobs' processes included), so latencies here are
  worse than on a quiet host; the CPU per delta figures are the ones that transfer. Before each
  configuration after the first the bench waits (at most 90 s) for the load average to fall to
  1.0, so none starts where the one before it left the machine. Even so a p99 moves a lot from
  one run to the next on this host, most of all at 500 streams, where the host is near its
  limit: one run is one sample (docs/delivery.md gives the spread seen).

{chr(10).join(lines)}
### What two idle cores could carry (estimate)

The CPU every process spent per delivered delta (workers, Daphne, fake provider, clients, Redis,
PostgreSQL: the whole pipeline on this host), and the delivery rate two otherwise idle cores could
sustain at that cost (2 CPU-seconds per second over it). An estimate from measured CPU, not a
measured rate: the measured rates are in the table above and below.

| load | whole-pipeline CPU per delta | sustainable on 2 idle cores | offered | ratio |
|---|---|---|---|---|
{chr(10).join(capacity)}

### Against the goals

| load | received | publish→client p99 | first delta→client p99 | mismatches | load avg |
|---|---|---|---|---|---|
{chr(10).join(goals)}

### Where the tail comes from: publish→client p50 / p99 by phase

Every run starts at once and has the same length, so the runs' starts (claims, first requests)
and their ends (answers, usage and events stored) come in bursts. **start**: frames published
before every run had published its first; **end**: from the first run's last frame on;
**steady**: in between, all the streams flowing.

| load | start | steady | end |
|---|---|---|---|
{chr(10).join(phases)}

### Against the per-token `group_send` on the core channels_redis layer (same run)

The baseline is what most Channels chat tutorials do: one `group_send` per token on
`channels_redis.core.RedisChannelLayer`, no coalescing; same streams, same machine, minutes apart.

| figure | streamrecover | per-token `group_send`, core layer | ratio |
|---|---|---|---|
{baseline}

### Against the previous design (recorded, not re-run)

The pipeline before this redesign (a thread and an event loop per run, two awaited Redis round
trips per frame, each run polling the database four times a second), measured by this bench on
this machine at commit 202b999 (100 streams × 30/s, load average 0.7 → 3.4):

| figure | now | before | ratio |
|---|---|---|---|
{before}

### Memory and checkpoint writes per active stream

Worker memory per stream: the workers' RSS growth from before the streams to its peak while they
ran (the RSS column), over the streams;
against the stream's committed text (UTF-8 JSON). Checkpoint writes: counted in the worker
(`CheckpointWriter.write`), per run per second of its span. Frames per Redis call: the frames
each of the workers' outbox script calls carried, on average (every run's frames on a worker's
loop leave together, one call per round trip), in the "frames/call" column. Garbage
collection: the cyclic collector's passes in the workers during the measured phase and the wall
time they stopped a worker (every thread, its loop included), in all and the longest (a pass the
kernel preempts on a busy host stops the worker that long too), in the "GC" column.

| load | memory per stream | text per stream | ratio to 2 × text | checkpoint writes/s/run | frames/call | GC | RSS |
|---|---|---|---|---|---|---|---|
{chr(10).join(memory)}

{floor}

Cut streams (`faults` row: every 2nd stream's connection cut once after 4,000 bytes, R1): of the
clients that saw their run end, {faults["mismatches"]} rebuilt something else than the committed
messages; {faults["dropped"]} sockets were dropped or given up on (a run not over within the
bench's time limit: the load could not be carried). Statuses when the bench stopped waiting:
{", ".join(f"{k} {v}" for k, v in sorted(faults["statuses"].items()))}.
"""
    return text


FLOOR_HEADER = (
    "| streams | text per stream | goal: 2 × text | bare connection + task: RSS, objects"
    " | httpx client per stream | one shared httpx client | bare RSS against the goal's allowance |\n"
    "|---|---|---|---|---|---|---|"
)


def stream_floor(texts: dict[int, float], quick: bool) -> str:
    """``bench.bench_floor`` at each load's stream count, against twice that load's text per stream
    (``texts``: streams → bytes of text per stream, from the delivery bench)."""
    from bench import bench_floor as bf

    load_before = os.getloadavg()[0]
    try:
        floors = bf.run(list(texts), repeat=1 if quick else 3)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"The floor of a stream: not measured: `bench.bench_floor` said: {exc}"
    by = {(f.kind, f.streams): f for f in floors}
    rows = []
    for streams, text in texts.items():
        allowance = 2 * text
        bare = by[("bare", streams)]
        within = bare.rss_per_stream <= allowance
        rows.append(
            f"| {streams} | {text:,.0f} B | {allowance:,.0f} B | "
            + " | ".join(
                f"{bf.kib(by[(kind, streams)].rss)}, {bf.kib(by[(kind, streams)].objects)}" for kind in bf.KINDS
            )
            + f" | {_ratio(bare.rss_per_stream, allowance)} ({'within' if within else 'above'} it) |"
        )
    repeats = "one each" if quick else "the median of 3, their range in brackets"
    return f"""The floor of a stream, whatever it carries (`python -m bench.bench_floor`): the same stream
counts, each stream one client connection to a local server in a process of its own (an SSE-like
chunked body, an event every {bf.INTERVAL_S:g} s), each read by one task, in a fresh process per measurement
({repeats}). Each cell: RSS growth (VmRSS) from before the streams to mid-stream over the streams,
then the Python objects they hold (tracemalloc, in a second round). **bare**: a socket, its asyncio
transport, a protocol keeping the unread chunk, one task; **httpx client per stream**: what a run
opens today (`HttpxTransport`: its own `httpx.AsyncClient` on the `netio` asyncio backend, a
streaming POST read through `aiter_raw`); **shared**: one `httpx.AsyncClient` (same backend, a
pool of a connection per stream) for all. The goal allows twice the text per stream the delivery
bench measured above. Load average {load_before:.1f} before.

{FLOOR_HEADER}
{chr(10).join(rows)}"""


# ---- recovery and billing ---------------------------------------------------------------------


def recovery(quick: bool) -> str:
    from bench import bench_recovery as br

    params = {"repeat": 3, "cut": 1500, "words": 80, "points": 2} if quick else {}
    load_before = os.getloadavg()[0]
    result = asyncio.run(br.run_all(**params))
    load_after = os.getloadavg()[0]
    p = result["params"]
    overhead = [
        f"| {r['strategy']} | {r['p50']:.1f} ms | {r['p90']:.1f} ms | {r['prep_p50']:.1f} ms | {r['ttfb_p50']:.1f} ms "
        f"| {_ratio(r['p50'], 10.0)} ({_ok(r['p50'] <= 10.0)}) |"
        for r in result["overhead"]
    ]
    billing = [
        f"| {100 * r['cut_fraction']:.0f}% | {r['ours_output']} | {r['naive_output']} "
        f"| {_ratio(r['ours_output'], r['naive_output'])} | {r['ours_input']} | {r['naive_input']} "
        f"| {_ratio(r['ours_input'], r['naive_input'])} |"
        for r in result["billing"]
    ]
    ours = sum(r["ours_output"] for r in result["billing"])
    naive = sum(r["naive_output"] for r in result["billing"])
    unint = result["billing"][0]["uninterrupted_output"] if result["billing"] else 0
    return f"""## Recovery overhead

Measured {_now()}.

`python -m bench.bench_recovery`: the engine against the fake provider on loopback, in one process.
A {p["words"]}-word answer is cut after {p["cut"]:,} body bytes and continued; {p["repeat"]} runs per
strategy after a warm-up run. **Overhead** = from the break (the interrupted attempt's end) to the
first continued delta at the sink, minus the backoff ({p["backoff_ms"]:g} ms here: the schedule's first
wait, scaled down) and minus the provider's time to first byte of the continuation. **prep** = from
the break to the continuation request being sent, less the backoff. For `prefill` (Anthropic) the
free `count_tokens` requests that keep `max_tokens` exact (both at once, one round trip) run during
the backoff, so they count only where they outlast it. Load average {load_before:.1f} → {load_after:.1f}.

| strategy | overhead p50 | overhead p90 | prep p50 | provider TTFB p50 | p50 vs the 10 ms goal |
|---|---|---|---|---|---|
{chr(10).join(overhead)}

## Billing against a naive retry

The same {p["words"]}-word story (uninterrupted: {unint} output tokens) cut at {p["points"]} points
spread over its length. **streamrecover** continues from the committed text (prefill);
**naive retry** resends the same request and generates everything again (the official SDKs'
`max_retries`, most frameworks). Output tokens paid = the fake provider's billing log (deltas sent
before the cut + the whole second response); input tokens = each response's `message_start` usage.
Every recovered answer equals the uninterrupted one.

| cut at | output paid: ours | output paid: naive | ratio | input paid: ours | input paid: naive | ratio |
|---|---|---|---|---|---|---|
{chr(10).join(billing)}

Over the sweep streamrecover paid {ours:,} output tokens and the naive retry {naive:,}
({_ratio(ours, naive)}); the continuation pays more input tokens (the partial answer goes back as
the prefix), which are several times cheaper per token than output at every major provider.
"""


# ---- parsing ----------------------------------------------------------------------------------


def _bench_module(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m bench.<module> <argv>`` from the repository, its output captured."""
    command = [sys.executable, "-m", f"bench.{module}", *argv]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)


def _not_measured(title: str, module: str, proc: subprocess.CompletedProcess[str]) -> str:
    """A section whose bench failed: what it said instead of its figures."""
    return f"## {title}\n\nNot measured: `bench.{module}` said: {proc.stderr.strip() or proc.stdout.strip()}\n"


def parse(quick: bool) -> str:
    argv = ["--repeat", "2", "--text-deltas", "300", "--json-fragments", "60", "--no-long"] if quick else []
    load_before = os.getloadavg()[0]
    proc = _bench_module("bench_parse", argv)
    if proc.returncode != 0:
        return _not_measured("Parsing", "bench_parse", proc)
    return f"""## Parsing

`python -m bench.bench_parse`: SSE events per second through decoding + parsing + accumulating, the
engine against the official anthropic SDK and the httpx-sse + `json.loads` floor (no accumulation).
The same bytes in the same chunks for every pipeline; best of the samples. Load average
{load_before:.1f} before. {proc.stderr.strip()}

{proc.stdout.strip()}
"""


def text(quick: bool) -> str:
    argv = ["--deltas", "200,2000", "--repeat", "1"] if quick else []
    load_before = os.getloadavg()[0]
    proc = _bench_module("bench_textmem", argv)
    if proc.returncode != 0:
        return _not_measured("A run's text in the worker", "bench_textmem", proc)
    return f"""## A run's text in the worker

`python -m bench.bench_textmem`: a worker keeps a streaming answer in two places, the engine's
blocks (checkpoints and continuations read them) and the live state a reconnecting client's
snapshot is built from. Both keep it as UTF-8. The same answer, delta by delta, in the fake
provider's vocabulary (mostly ASCII words, some accented, some CJK, an emoji now and then) or in
plain ASCII. **Held**: what both grew by (tracemalloc, after a checkpoint's read), against the same
text as two `str` (the layout before, computed: `2 * sys.getsizeof(text)`, 4 bytes per character
once one emoji is in it). **Per delta**: applying text frames to the live state, best of the
samples, against `+=` on a `str` attribute (the reducer before) in the same run: that copies the
whole text on each delta. Load average {load_before:.1f} before. Measured {_now()}.

{proc.stdout.strip()}
"""


# ---- the file ---------------------------------------------------------------------------------

RUNNERS = {"delivery": delivery, "recovery": recovery, "parse": parse, "text": text}


def _previous(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    text = path.read_text()
    found = re.findall(r"<!-- bench:(\w+) -->\n(.*?)<!-- /bench:\1 -->", text, flags=re.S)
    return dict(found)


def render(sections: dict[str, str]) -> str:
    head = f"""# Benchmarks

Written by `make bench` (`python -m bench.report`) on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.
A section not re-run keeps the date it was written with.

* **Machine**: {_machine()}. Everything (PostgreSQL, Redis, Daphne, the workers, the fake
  provider, the clients) runs on it, and it was **shared with other jobs** while these figures
  were taken: each section gives the load average it saw.
* **Versions**: {_versions()}.
* **Reproduce**: `make bench` (all but the analytics history), `make bench-analytics`, or one
  bench: `python -m bench.bench_delivery --help`, `python -m bench.bench_recovery --help`,
  `python -m bench.bench_parse --help`, `python -m bench.bench_textmem --help`,
  `python -m bench.bench_floor --help`, `python -m bench.bench_analytics --help`. PostgreSQL and
  Redis as for the tests; `BENCH_DATABASE_URL` / `BENCH_REDIS_URL` choose the database and Redis db.
  `python -m bench.bench_delivery --profile sample|cprofile` shows where a worker's time goes.
"""
    body = [head]
    for name in SECTIONS:
        if name in sections:
            body.append(f"<!-- bench:{name} -->\n{sections[name].rstrip()}\n<!-- /bench:{name} -->\n")
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="delivery,recovery,parse,text", help="comma-separated sections to run")
    parser.add_argument("--quick", action="store_true", help="tiny parameters (the CI smoke run)")
    parser.add_argument("--out", default="", help=f"the file to write (default {OUT.name}; none with --quick)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    out = Path(args.out) if args.out else (None if args.quick else OUT)
    sections = _previous(out) if out is not None else {}
    for name in [n for n in args.only.split(",") if n]:
        if name == "analytics":
            proc = subprocess.run([sys.executable, "-m", "bench.bench_analytics"], cwd=REPO, check=False)
            from bench.bench_analytics import RESULTS as analytics_results

            if proc.returncode == 0 and analytics_results.exists():
                sections[name] = analytics_results.read_text().replace("# ", "## ", 1)
            continue
        sections[name] = RUNNERS[name](args.quick)
        print(sections[name], flush=True)
        if out is not None:  # after each section: a later failure loses only its own
            out.write_text(render(sections))
    if out is not None:
        print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
