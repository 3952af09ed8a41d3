"""Template filters for the chat page: JSON values shown as its script shows them."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.translation import gettext as _

from ..chat.jsjson import stringify

register = template.Library()


@register.filter
def as_json(value: Any) -> str:
    """``value`` as the page's script shows it: ``JSON.stringify(value)``, character for character
    (a tool call's input: ``3.0`` as ``3``, integer-like keys first). Not marked safe: the
    template escapes it."""
    return stringify(value)


@register.filter
def role_label(message: Any) -> str:
    """A message's role line: ``tool results`` for a user message that only carries tool results
    (the provider's shape puts them in a user turn; the reader did not write them), as the script
    labels it."""
    content = message.get("content") if isinstance(message, dict) else None
    if (
        message.get("role") == "user"
        and content
        and all(isinstance(block, dict) and block.get("type") == "tool_result" for block in content)
    ):
        return str(_("tool results"))
    return str(message.get("role", ""))


@register.filter
def as_text(value: Any) -> str:
    """A string as it is, anything else :func:`as_json` (a tool result's content)."""
    return value if isinstance(value, str) else as_json(value)
