"""The Gemini candidate metadata a spliced answer's last chunk carries, made from its attempts' own.

Each attempt's is what the Gemini adapter passed on (``providers.gemini.CandidateMetadata``):
``finishMessage``, ``safetyRatings``, ``citationMetadata``, ``groundingMetadata``,
``urlContextMetadata``, ``avgLogprobs``. The answer the
client gets may be several attempts' text, so each field says what is true of the whole of it:

- ``finishMessage``: the last attempt's, since it says why the answer stopped, which the last
  attempt decided.
- ``safetyRatings``: every attempt's, per category the highest probability (and blocked if any
  attempt blocked it): the answer holds text that each attempt rated.
- ``citationMetadata`` and ``groundingMetadata``: the last attempt's that has them. Their offsets
  (a citation source's ``startIndex``/``endIndex``, a grounding support's ``segment``) count bytes
  of that attempt's own text. Once an attempt broke, the client's text is the kept text and then
  the continuation's, joined at a seam where an overlap may have been trimmed, so no attempt's
  offsets can be trusted against it: the citations are dropped and so are the grounding supports,
  while the grounding's sources, search queries and search entry point are passed on.
- ``urlContextMetadata`` (the URLs the URL context tool retrieved, no offsets): the last attempt's
  that has it, as the grounding's sources are.
- ``avgLogprobs``: the mean log probability of the attempt's own tokens. The spliced answer's tokens
  are no attempt's: the kept text's and then the continuation's, some trimmed at the seam. It is
  passed on while no attempt broke, and left out once one did (no mean of the client's text is known).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ..providers.gemini import CandidateMetadata, SafetyRating
from .wire import AttemptMetadata

# HarmProbability, lowest first
_PROBABILITIES = ("HARM_PROBABILITY_UNSPECIFIED", "NEGLIGIBLE", "LOW", "MEDIUM", "HIGH")


def _rank(rating: SafetyRating) -> int:
    probability = rating.get("probability")
    return _PROBABILITIES.index(probability) if probability in _PROBABILITIES else 0


def _ratings(attempts: Sequence[CandidateMetadata]) -> list[SafetyRating]:
    """Per category (in the order they first came) the highest rating, blocked if any was."""
    worst: dict[str, SafetyRating] = {}
    for attempt in attempts:
        for rating in attempt.get("safetyRatings") or ():
            category = str(rating.get("category", ""))
            seen = worst.get(category)
            blocked = bool(rating.get("blocked")) or bool(seen and seen.get("blocked"))
            chosen = SafetyRating(**rating) if seen is None or _rank(rating) > _rank(seen) else seen
            if blocked:
                chosen["blocked"] = True
            worst[category] = chosen
    return list(worst.values())


def spliced_metadata(attempts: Sequence[AttemptMetadata]) -> CandidateMetadata:
    """The candidate fields for the last chunk of the answer ``attempts`` (the turn's, in order) made."""
    own = [cast(CandidateMetadata, attempt.values) for attempt in attempts]
    spliced = any(attempt.interrupted for attempt in attempts)
    out = CandidateMetadata()
    if own and "finishMessage" in own[-1]:
        out["finishMessage"] = own[-1]["finishMessage"]
    ratings = _ratings(own)
    if ratings:
        out["safetyRatings"] = ratings
    citations = next((m["citationMetadata"] for m in reversed(own) if "citationMetadata" in m), None)
    if citations is not None and not spliced:
        out["citationMetadata"] = citations
    grounding = next((m["groundingMetadata"] for m in reversed(own) if "groundingMetadata" in m), None)
    if grounding is not None:
        if spliced:
            grounding = grounding.copy()
            grounding.pop("groundingSupports", None)
        out["groundingMetadata"] = grounding
    url_context = next((m["urlContextMetadata"] for m in reversed(own) if "urlContextMetadata" in m), None)
    if url_context is not None:
        out["urlContextMetadata"] = url_context
    if own and "avgLogprobs" in own[-1] and not spliced:
        out["avgLogprobs"] = own[-1]["avgLogprobs"]
    return out
