"""Every Celery worker command the README and docs/ give runs the pool the README's tested one does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
WORKER = re.compile(r"\bcelery -A \S+ worker\b")


def worker_commands() -> dict[str, list[str]]:
    """Each document -> the Celery worker command lines of its code blocks."""
    found = {}
    for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        blocks = FENCE.findall(path.read_text(encoding="utf-8"))
        lines = [line for block in blocks for line in block.splitlines() if WORKER.search(line)]
        if lines:
            found[path.relative_to(ROOT).as_posix()] = lines
    return found


def test_every_worker_command_in_the_docs_runs_the_solo_pool() -> None:
    """The README's worker line (run by tests/test_readme_integration.py) is ``--pool=solo``: one
    process streaming up to ``WORKER_MAX_RUNS`` runs on its loop. docs/protocol.md's demo gave the
    default pool instead (prefork: a child per CPU, each with its own loop and its own runs)."""
    commands = worker_commands()
    assert "README.md" in commands
    assert "docs/protocol.md" in commands
    assert {doc: [line for line in lines if "--pool=solo" not in line] for doc, lines in commands.items()} == {
        doc: [] for doc in commands
    }
