"""JSON text exactly as JavaScript's ``JSON.stringify`` writes a value (the chat page's script shows tool inputs so).

A page rendered without JavaScript must show a tool call's input as the script does, and the
two differ where Python's ``json.dumps`` does: JavaScript holds every number as a double and
writes it the shortest way (``3.0`` is ``3``, ``1e-07`` is ``1e-7``, an integer past 2**53 is
rounded), puts an object's integer-like keys first, in numeric order, and escapes a lone
surrogate. The value is what is stored: both render it, neither has the model's raw text.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ARRAY_INDEX_MAX = 2**32 - 2  # the largest key a JavaScript object orders as an integer


def stringify(value: Any) -> str:
    """``value`` (a JSON value) as ``JSON.stringify(value)`` writes it, compact."""
    if value is None or value is True or value is False:
        return json.dumps(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        try:
            return _number(float(value))  # parsed by JavaScript as the nearest double
        except OverflowError:
            return "null"  # Infinity there, which JSON.stringify writes as null
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, dict):
        items = ",".join(f"{_string(str(key))}:{stringify(value[key])}" for key in _object_order(value))
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(stringify(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _string(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)  # escapes what JSON.stringify escapes, but lone surrogates
    if _LONE_SURROGATE.search(quoted):
        quoted = _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)
    return quoted


def _object_order(value: dict[Any, Any]) -> list[Any]:
    """A JavaScript object's key order: array-index keys ascending, then the others as inserted."""
    indexes = [key for key in value if _array_index(key) is not None]
    if not indexes:
        return list(value)
    return sorted(indexes, key=lambda key: _array_index(key) or 0) + [key for key in value if key not in indexes]


def _array_index(key: Any) -> int | None:
    text = str(key)
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        return None
    number = int(text)
    return number if number <= _ARRAY_INDEX_MAX else None


def _number(number: float) -> str:
    """ECMAScript's Number::toString (JSON.stringify writes NaN and the infinities as null)."""
    if not math.isfinite(number):
        return "null"
    if number == 0:
        return "0"  # -0 too
    if number < 0:
        return "-" + _number(-number)
    # Python's repr is the shortest round-tripping decimal, as JavaScript's is
    _, digits, exponent = Decimal(repr(number)).normalize().as_tuple()
    assert isinstance(exponent, int)
    s = "".join(map(str, digits))
    k = len(s)
    n = exponent + k  # the value is 0.s * 10**n
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + s
    power = n - 1
    mantissa = s if k == 1 else s[0] + "." + s[1:]
    return f"{mantissa}e{'+' if power >= 0 else '-'}{abs(power)}"
