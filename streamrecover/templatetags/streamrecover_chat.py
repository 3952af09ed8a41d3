"""Template filters for the chat page: JSON values shown as its script shows them."""

from __future__ import annotations

from typing import Any

from django import template

from ..chat.jsjson import stringify

register = template.Library()


@register.filter
def as_json(value: Any) -> str:
    """``value`` as the page's script shows it: ``JSON.stringify(value)``, character for character
    (a tool call's input: ``3.0`` as ``3``, integer-like keys first). Not marked safe: the
    template escapes it."""
    return stringify(value)


@register.filter
def as_text(value: Any) -> str:
    """A string as it is, anything else :func:`as_json` (a tool result's content)."""
    return value if isinstance(value, str) else as_json(value)
