"""Citations that point into their own text block's characters (Responses' ``url_citation``).

Such a citation carries ``start_index`` and ``end_index``: character offsets (code points) into
the text of the block it belongs to, as the response that sent it wrote that text. Other
citations (Anthropic's ``web_search_result_location``, ``char_location``) say nothing about where
in the answer they apply, or index a document rather than the answer, and never carry both keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

START = "start_index"
END = "end_index"


def span_of(citation: Mapping[str, Any]) -> tuple[int, int] | None:
    """The ``[start, end)`` characters the citation covers, or None when it covers no span of its block."""
    start, end = citation.get(START), citation.get(END)
    if type(start) is not int or type(end) is not int or not 0 <= start <= end:
        return None
    return start, end


def is_span(citation: Mapping[str, Any]) -> bool:
    return span_of(citation) is not None


def makes_cited_span(citations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a text block with ``citations`` is a cited span (Anthropic's: the block is what its
    citations support) rather than plain text that span citations point into."""
    return any(not is_span(c) for c in citations)


def moved(citation: Mapping[str, Any], shift: int) -> dict[str, Any]:
    """The citation with its span moved ``shift`` characters along its block's text."""
    span = span_of(citation)
    assert span is not None
    return {**citation, START: span[0] + shift, END: span[1] + shift}
