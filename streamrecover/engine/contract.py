"""The contract every provider adapter fulfils: requests, parsers, strategies, provider config.

An adapter translates; it holds no recovery logic. It turns the canonical conversation
into the provider's HTTP request, the provider's SSE events into normalized stream
events, and the provider's errors into classified ``ProviderError``s. It also states
which continuation strategy a model supports (a table, overridable in settings).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, cast, runtime_checkable

from .errors import ProviderError
from .events import ProviderErrorEvent, StreamEvent
from .sse import SSEEvent

SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization", "cookie"})


class Strategy(enum.StrEnum):
    """How a provider is asked to carry on from a partial assistant message."""

    PREFILL = "prefill"
    PREFIX_FLAG = "prefix_flag"
    CONTINUE_MESSAGE = "continue_message"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """A provider-neutral request. ``messages`` are canonical: ``{"role", "content": [blocks]}``.

    The last message may be an assistant message (a prefill); with ``"prefix": True`` on it
    the adapter sends the provider's prefix flag.
    """

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int = 1024
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    thinking_budget: int | None = None
    structured: bool = False  # JSON mode or a forced tool: continue only with prefill
    temperature: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Anthropic beta flags a proxied client sent (its ``anthropic-beta``), for fields in ``extra``
    # that need them; adapters of other APIs have no such header and leave them out
    betas: tuple[str, ...] = ()
    # the name Chat Completions carries ``max_tokens`` under (``max_tokens`` or
    # ``max_completion_tokens``): a proxied client's own; None: the provider's
    max_tokens_field: str | None = None


@dataclass(frozen=True, slots=True)
class ThinkingRule:
    """How a model's thinking budget fits a call that may ask for less than the turn's
    ``max_tokens`` (a continuation, a restart): a budget not below what is left is lowered to one
    below it, never under ``minimum``, the smallest budget the model takes (None where the adapter
    does not know it: the budget is then not lowered, as the model took it). Where even the
    minimum does not fit, ``send_minimum`` says what goes: True, the minimum, where the
    provider's output limit caps thinking and answer together (Gemini's ``maxOutputTokens``);
    False, no budget at all, where the provider refuses one at or above the limit (Anthropic)."""

    minimum: int | None
    send_minimum: bool


@dataclass(frozen=True, slots=True)
class HTTPRequest:
    method: str
    url: str
    headers: dict[str, str]
    json: dict[str, Any]

    def redacted(self) -> dict[str, Any]:
        """The request as it may be stored: secret headers replaced."""
        headers = {k: ("[redacted]" if k.lower() in SECRET_HEADERS else v) for k, v in self.headers.items()}
        return {"method": self.method, "url": self.url, "headers": headers, "json": self.json}


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a provider-side response can be re-attached after a break (native resume): its id
    and the last event whose effect the kept blocks hold (OpenAI's ``starting_after``)."""

    response_id: str
    after: int

    def as_dict(self) -> dict[str, Any]:
        return {"response_id": self.response_id, "after": self.after}


class StreamParser(Protocol):
    """Stateful: one per HTTP response."""

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        """Normalized events for one SSE event; raises ``ParseError`` on bad data."""
        ...


class ProviderAdapter(Protocol):
    name: str  # "anthropic", "openai", "fake-anthropic", ...

    def build_request(self, request: ModelRequest) -> HTTPRequest: ...

    def new_parser(self) -> StreamParser: ...

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """Classify a non-2xx response (before any stream started)."""
        ...

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        """Classify an error delivered inside a 200 stream."""
        ...

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        """The strategy this model supports (settings may override it)."""
        ...

    @property
    def echoes_prefix(self) -> bool:
        """True where a prefix-flag continuation repeats the prefix (Mistral)."""
        ...

    @property
    def text_delta_is_token(self) -> bool:
        """True where the server streams a text delta per output token (OpenAI, not Azure's
        buffering content filter): a broken stream's text is then counted a token per delta,
        but for a delta that cannot be one token (``translate.delta_token_bound``), which is
        bounded by its bytes like every delta where this is False. It must never say True of a
        server whose short deltas can carry several tokens of plain text: the count would be
        low, and a continuation could take the turn past its ``max_tokens``."""
        ...

    @property
    def min_max_tokens(self) -> int:
        """The smallest output budget a request may ask for (OpenAI Responses refuses a
        ``max_output_tokens`` below 16): with less left, the turn ends at its ``max_tokens``."""
        ...

    def thinking_rule(self, model: str) -> ThinkingRule:
        """How ``model``'s thinking budget is lowered when less than the turn's ``max_tokens`` is left."""
        ...

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        """A request for the provider's free count of ``request``'s input tokens, or None
        where the provider has no such endpoint."""
        ...

    def read_count(self, body: bytes) -> int | None:
        """The input-token count in a ``count_request`` response body."""
        ...


@runtime_checkable
class ResumableParser(Protocol):
    """A parser that follows the provider's event cursor (OpenAI Responses)."""

    def resume_point(self, response_id: str | None = None) -> ResumePoint | None:
        """Where to re-attach (``response_id``: the response, when this stream never named it)."""
        ...


@runtime_checkable
class ResumableAdapter(Protocol):
    """An adapter whose provider keeps generating after a break and lets a client re-attach."""

    @property
    def native_resume(self) -> bool:
        """True when requests are made so that they can be re-attached (a setting per provider)."""
        ...

    def resume_request(self, point: ResumePoint) -> HTTPRequest:
        """The request that streams the response's events after ``point.after``."""
        ...

    def cancel_request(self, response_id: str) -> HTTPRequest:
        """The request that stops the response (a cancelled run)."""
        ...


def is_protocol_class(cls: type) -> bool:
    """Whether ``cls`` is itself a ``Protocol`` (``typing.Protocol`` included), not a class
    that merely subclasses one to implement it."""
    return bool(cls.__dict__.get("_is_protocol", False))


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The public members a class must have to fulfil ``protocol`` (methods, properties and
    declared attributes), in the order it declares them (``typing.get_protocol_members``
    is Python 3.13's, unordered)."""
    names: dict[str, None] = {}
    for base in reversed(protocol.__mro__):
        if is_protocol_class(base):  # ``Protocol`` itself too: nothing public
            for name in (*inspect.get_annotations(base), *vars(base)):
                if not name.startswith("_"):
                    names[name] = None
    return tuple(names)


_CONFORMS: dict[tuple[type, type], bool] = {}


def _conforms(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)``, decided once per class: a runtime-checkable protocol's
    check walks its members each time (~10 µs on 3.11), and the engine asks at every checkpoint."""
    key = (type(obj), protocol)
    found = _CONFORMS.get(key)
    if found is None:
        found = _CONFORMS[key] = isinstance(obj, protocol)
    return found


def resumes_natively(adapter: object) -> TypeGuard[ResumableAdapter]:
    """Whether ``adapter`` can re-attach to a broken response and is configured to."""
    return _conforms(adapter, ResumableAdapter) and bool(cast(ResumableAdapter, adapter).native_resume)


def follows_cursor(parser: object) -> TypeGuard[ResumableParser]:
    """Whether ``parser`` knows where its stream can be re-attached."""
    return _conforms(parser, ResumableParser)


# The user message of the ``continue_message`` strategy. It is stored with the attempt's
# request and named in the event; the fake provider recognises it exactly.
CONTINUE_INSTRUCTION = (
    "Your previous response was interrupted. Continue exactly where it stopped, "
    "without repeating anything you already wrote."
)


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """How to reach one provider. ``api_key`` is a secret: never log or store it."""

    name: str  # adapter name: "anthropic", "openai", "openai-responses", ...
    base_url: str
    api_key: str = field(default="", repr=False)
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    # model glob -> Strategy value; first match wins, before the adapter's own table
    strategy_overrides: Mapping[str, str] = field(default_factory=dict)
    prefix_flag: bool = False  # OpenAI-compatible endpoint that takes {"prefix": true} (DeepSeek, Mistral)
    echoes_prefix: bool = False  # the prefix-flag response repeats the prefix (Mistral)
    # the server continues a final assistant message asked with ``continue_final_message``
    # (vLLM, SGLang, llama.cpp): the prefill strategy on an OpenAI-compatible endpoint
    continue_final_message: bool = False
    anthropic_version: str = "2023-06-01"
    connect_timeout_s: float = 10.0
    # OpenAI Responses: background requests, re-attached after a break (``NATIVE_RESUME``)
    native_resume: bool = False
    # Azure OpenAI: its URL scheme and ``api-key`` header (``AZURE``, ``AZURE_API_VERSION``,
    # ``AZURE_DEPLOYMENT``); the deployment, when set, replaces the model name
    azure: bool = False
    azure_api_version: str | None = None
    azure_deployment: str | None = None
    # Chat Completions: the name of the output limit, ``max_tokens`` or ``max_completion_tokens``;
    # None: ``max_completion_tokens`` on OpenAI's own API (its o-series and gpt-5 refuse
    # ``max_tokens``), ``max_tokens`` elsewhere (compatible servers, Azure's older API versions)
    max_tokens_field: str | None = None
