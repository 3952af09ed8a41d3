"""The README's settings table is the code's: every key of ``conf.DEFAULTS`` with its default, nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from streamrecover.conf import DEFAULTS

README = Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| `([A-Z_]+)` \| ([^|]+) \|", re.M)


def settings_table() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Settings (`STREAMRECOVER`)", 1)[1].split("\n## ", 1)[0]
    rows = ROW.findall(section)
    table = {key: default.strip() for key, default in rows}
    assert len(table) == len(rows), "a key is listed twice"
    return table


def shown(value: Any) -> str:
    """A default as the table writes it: providers by name, strings bare, everything else as Python."""
    if isinstance(value, dict):
        return ", ".join(value)
    return value if isinstance(value, str) else repr(value)


def test_every_key_and_no_other() -> None:
    assert sorted(settings_table()) == sorted(DEFAULTS)


def test_every_default_as_in_the_code() -> None:
    table = settings_table()
    wrong = {
        key: (table[key], shown(value)) for key, value in DEFAULTS.items() if table[key].strip("`") != shown(value)
    }
    assert wrong == {}


def test_the_reader_sees_a_change() -> None:
    """The check is not vacuous: a different default or an extra row is noticed."""
    table = settings_table()
    assert table["MAX_CONTINUATIONS"] == "5"
    assert shown(6) != table["MAX_CONTINUATIONS"]
    assert shown([1, 2]) == "[1, 2]"
    assert shown(1.0) == "1.0"
    assert shown(False) == "False"
    assert shown({"fake": {}, "anthropic": {}}) == "fake, anthropic"
