"""``TextJSONField``: a JSONField that stores any string exactly, U+0000 and lone surrogates included,
and every object's keys in the order they were written.

PostgreSQL's jsonb refuses ``\\u0000`` and UTF-8 has no lone surrogates, yet both are valid in
the JSON a provider streams (a model that echoes binary data from a tool writes NUL). Storing
them as they are would fail the write, and with it the committed answer. Such characters are
stored escaped with a private-use character, which is itself escaped, so the mapping is
one-to-one and every read gives back exactly what was written.

jsonb also re-orders an object's keys (shortest first): a tool call's input read back from it
is not the object the model wrote, and history sent again in that order no longer matches a
provider's prompt cache of the turn. On PostgreSQL the field is a ``text`` column holding the
JSON as written; nothing in the app queries inside these values.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import models

ESCAPE = "\ue000"
_NEEDS_ESCAPE = re.compile("[\x00\ue000\ud800-\udfff]")
_ESCAPED = re.compile("\ue000(\ue000|0|u[0-9a-f]{4})")


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char == ESCAPE:
        return ESCAPE + ESCAPE
    if char == "\x00":
        return ESCAPE + "0"
    return f"{ESCAPE}u{ord(char):04x}"


def _unescape_char(match: re.Match[str]) -> str:
    code = match.group(1)
    if code == ESCAPE:
        return ESCAPE
    if code == "0":
        return "\x00"
    return chr(int(code[1:], 16))


def escape_text(text: str) -> str:
    return _NEEDS_ESCAPE.sub(_escape_char, text) if _NEEDS_ESCAPE.search(text) else text


def unescape_text(text: str) -> str:
    return _ESCAPED.sub(_unescape_char, text) if ESCAPE in text else text


def _walk(value: Any, convert: Any) -> Any:
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, dict):
        return {convert(k) if isinstance(k, str) else k: _walk(v, convert) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, convert) for v in value]
    return value


# Backends whose JSON column re-orders keys, and the column type that keeps the text as written.
_TEXT_COLUMNS = {"postgresql": "text"}


class TextJSONField(models.JSONField):
    """A ``JSONField`` whose strings and key order round-trip exactly on every database (see the module)."""

    def db_type(self, connection: Any) -> str | None:
        return _TEXT_COLUMNS.get(connection.vendor) or super().db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if connection.vendor not in _TEXT_COLUMNS:
            return super().get_db_prep_value(value, connection, prepared)
        if not prepared:
            value = self.get_prep_value(value)
        # UTF-8 as written: the escaping above left no NUL and no lone surrogate to encode
        return json.dumps(value, cls=self.encoder, ensure_ascii=False)

    def get_prep_value(self, value: Any) -> Any:
        return super().get_prep_value(_walk(value, escape_text))

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return _walk(super().from_db_value(value, expression, connection), unescape_text)
