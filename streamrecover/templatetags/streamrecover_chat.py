"""Template filters for the chat page: JSON values shown as its script shows them."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def as_json(value: Any) -> str:
    """``value`` as JSON, compact and with non-ASCII text kept, as ``JSON.stringify`` shows it
    (a tool call's input). Not marked safe: the template escapes it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@register.filter
def as_text(value: Any) -> str:
    """A string as it is, anything else :func:`as_json` (a tool result's content)."""
    return value if isinstance(value, str) else as_json(value)
