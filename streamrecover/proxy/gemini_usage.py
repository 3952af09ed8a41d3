"""The ``usageMetadata`` details of a Gemini client's chunk, made from its attempts' own.

The counts (``promptTokenCount``, ``candidatesTokenCount``, ``thoughtsTokenCount``,
``cachedContentTokenCount``) are the writer's, summed over the turn's attempts. The details each
attempt's upstream sent (``providers.gemini.UsageDetails``, the latest of each attempt) are made to
agree with them:

- Prompt side (``promptTokensDetails``, ``cacheTokensDetails``, ``toolUsePromptTokenCount``,
  ``toolUsePromptTokensDetails``): each attempt's request was billed, so, as the counts are, they are
  summed per modality over the attempts. An uninterrupted answer's are the upstream's as sent; after
  a break they still add up to the summed ``promptTokenCount`` (and cache count).
- Output side (``candidatesTokensDetails``): one attempt's are passed as sent. Once a break made the
  answer of several attempts, ``candidatesTokenCount`` counts a broken attempt by the engine's
  estimate, which no upstream's detail knows: when every attempt that sent details named one and
  the same modality, the details are that modality with ``candidatesTokenCount``; otherwise they
  are left out rather than disagree with the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from ..providers.gemini import GeminiMetadata, ModalityTokenCount, UsageDetails
from .wire import AttemptMetadata

_SUMMED = ("promptTokensDetails", "cacheTokensDetails", "toolUsePromptTokensDetails")


def _summed(lists: Iterable[list[ModalityTokenCount]]) -> list[ModalityTokenCount]:
    """Per modality (in the order they first came) the sum of the counts."""
    totals: dict[str, int] = {}
    for counts in lists:
        for item in counts:
            totals[item["modality"]] = totals.get(item["modality"], 0) + item["tokenCount"]
    return [ModalityTokenCount(modality=m, tokenCount=n) for m, n in totals.items()]


def turn_details(attempts: Sequence[AttemptMetadata], candidates_tokens: int) -> UsageDetails:
    """The details for a chunk whose ``candidatesTokenCount`` is ``candidates_tokens``."""
    own = [d for a in attempts if (d := cast(GeminiMetadata, a.values).get("usageDetails")) is not None]
    details = UsageDetails()
    if not own:
        return details
    for name in _SUMMED:
        lists = [d[name] for d in own if name in d]  # type: ignore[literal-required]
        if lists:
            details[name] = _summed(lists)  # type: ignore[literal-required]
    tool_use = [d["toolUsePromptTokenCount"] for d in own if "toolUsePromptTokenCount" in d]
    if tool_use:
        details["toolUsePromptTokenCount"] = sum(tool_use)
    outputs = [d["candidatesTokensDetails"] for d in own if "candidatesTokensDetails" in d]
    if len(own) == 1 and outputs:  # one upstream answer: its own
        details["candidatesTokensDetails"] = outputs[0]
    elif outputs:
        modalities = {item["modality"] for counts in outputs for item in counts}
        if len(modalities) == 1:
            details["candidatesTokensDetails"] = [
                ModalityTokenCount(modality=modalities.pop(), tokenCount=candidates_tokens)
            ]
    return details
