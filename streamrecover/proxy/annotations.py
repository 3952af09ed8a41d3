"""The Responses annotations of a spliced answer's text, made from the citations its blocks carry.

A Responses provider's annotations arrive as citations of their text block, their offsets already
moved onto the block's spliced text by the engine (``engine.citespan``): they go out as they are.
An Anthropic web search answer cites a whole span (its text block) from a search result, which
has a url and a title: that becomes a ``url_citation`` covering the whole message the span is
written as, once its text is complete. Other Anthropic citations (``char_location`` and the like)
point into documents, not web pages: Responses has no annotation for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypedDict

from ..providers.openai_responses import ANNOTATION_TYPES

Annotation = Mapping[str, object]  # one annotation of an output text part, as the client gets it

# Anthropic's citations that name a web page (a search result's url and title)
_WEB_RESULTS = frozenset({"web_search_result_location"})


class WholeTextCitation(TypedDict):
    """A web page the whole of a message's text cites; its offsets are known at the message's end."""

    type: Literal["url_citation"]
    url: str
    title: str


class URLCitation(WholeTextCitation):
    start_index: int
    end_index: int


def as_annotation(citation: Mapping[str, object]) -> Annotation | None:
    """A Responses provider's own annotation, as it came; None for anyone else's citation."""
    return dict(citation) if citation.get("type") in ANNOTATION_TYPES else None


def whole_text_annotation(citation: Mapping[str, object]) -> WholeTextCitation | None:
    """Anthropic's web search result citation as a url citation of the whole span it cites."""
    url = citation.get("url")
    if citation.get("type") not in _WEB_RESULTS or not isinstance(url, str):
        return None
    title = citation.get("title")
    return WholeTextCitation(type="url_citation", url=url, title=title if isinstance(title, str) else "")


def covering(whole: WholeTextCitation, text: str) -> URLCitation:
    """``whole`` as the annotation of all of ``text`` (offsets in characters)."""
    return URLCitation(type="url_citation", url=whole["url"], title=whole["title"], start_index=0, end_index=len(text))
