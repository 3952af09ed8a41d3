"""What a model name may hold, and how it goes into a URL path: never past its own segments."""

from __future__ import annotations

import re
from urllib.parse import quote

# Characters that would end the path (?, #), re-encode it (%, \), or have no place in a name
# (control characters and whitespace). "/" and ":" stay allowed: real names use them
# (meta-llama/Llama-3.1-8B-Instruct, accounts/fireworks/models/x, llama3:8b, tunedModels/x).
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f-\x9f?#%\\\s]")
_DOT_SEGMENTS = frozenset({".", ".."})


def model_name_problem(model: str) -> str | None:
    """Why ``model`` cannot be a model name (a short phrase to follow "model: "), or None.

    An adapter puts the name in a URL path (Gemini, Azure): a ``..`` segment would climb out of
    the model's path (past a key's model limit, to another endpoint of the provider's API), a
    ``?`` or ``#`` would cut the path short."""
    found = _FORBIDDEN.search(model)
    if found:
        char = found.group()
        if char == "\x00":
            shown = "NUL (\\u0000)"
        elif char.isprintable() and not char.isspace():
            shown = repr(char)
        else:
            shown = f"U+{ord(char):04X}"
        return f"cannot contain {shown} (whitespace, control characters, ?, #, % and \\ are refused)"
    if any(segment in _DOT_SEGMENTS for segment in model.split("/")):
        return 'cannot have a "." or ".." path segment'
    return None


def path_segment(value: str) -> str:
    """``value`` as one URL path segment: every reserved character escaped, and a ``.`` or
    ``..`` escaped too, which the HTTP client would otherwise resolve."""
    if value in _DOT_SEGMENTS:
        return value.replace(".", "%2E")
    return quote(value, safe="")


def path_segments(value: str) -> str:
    """``value`` as URL path segments: its ``/`` kept, each segment escaped (``path_segment``)."""
    return "/".join(path_segment(segment) for segment in value.split("/"))
