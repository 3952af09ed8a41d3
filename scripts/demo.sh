#!/usr/bin/env bash
# The README's first command: the demo chat on embedded defaults (SQLite, the in-process
# channel layer, runs executed in a thread of the Daphne process, the built-in fake provider).
#   bash scripts/demo.sh       the chat on http://127.0.0.1:8000/streamrecover/ (login demo / demo)
#   bash scripts/demo.sh cli   the one-shot command-line run with an injected fault (make demo-cli)
# DEMO_PORT, DEMO_HOST: where it listens; DEMO_PYTHON: the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
unset DATABASE_URL REDIS_URL
PY=${DEMO_PYTHON:-.venv/bin/python}
HOST=${DEMO_HOST:-127.0.0.1}
PORT=${DEMO_PORT:-8000}

if [ "${1:-}" != "cli" ] && (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; then
  # Daphne would log its listen failure and exit 0, after this script printed the address of
  # whatever else answers there (another demo, perhaps an older one).
  echo "make demo: $HOST:$PORT is in use; choose another port, e.g. DEMO_PORT=$((PORT + 1)) make demo" >&2
  exit 1
fi

$PY manage.py migrate --verbosity 0

if [ "${1:-}" = "cli" ]; then
  # The command marks each break, continuation and recovery in the answer it streams to
  # stdout; the structured log lines (stderr, same terminal) would land in the middle of its
  # words. LOG_LEVEL=INFO make demo-cli shows them too. streamrecover_demo_run is
  # streamrecover_run holding the database's demo lock (shared) while the run executes: a make
  # demo starting meanwhile leaves that run to this process.
  export LOG_LEVEL=${LOG_LEVEL:-ERROR}
  exec $PY manage.py streamrecover_demo_run --provider fake --model fake-claude \
    --prompt "Tell me a story about a lighthouse keeper. [[words=160]]" \
    --fault "cut:bytes=2500" --fault "error:events=30,type=overloaded_error" --backoff-scale 0.5
fi

$PY manage.py streamrecover_demo_user
# The fake provider spaces its SSE events so the answer visibly streams.
export STREAMRECOVER_FAKE_EVENT_DELAY=${STREAMRECOVER_FAKE_EVENT_DELAY:-0.03}
# Daphne's runserver: the ASGI app (HTTP + WebSockets) plus the static files, no autoreload
# (runs execute in threads of this process). First it executes to their end the runs the last
# server left mid-answer (stopped, killed: "running" with nobody on them), all at once unless
# another demo process uses this database (a server, a make demo-cli run: then those older than
# STALE_AFTER_SECONDS, the other's are alive). It prints the chat's address (and Daphne's banner) once it listens, not before.
# Daphne exits 0 when it cannot listen; this command exits 1 and says why, for a port taken since
# the check above or held without answering it.
exec $PY manage.py streamrecover_demo_serve --noreload "$HOST:$PORT"
