"""Text that grows by appends, held as UTF-8: a run's answer as the worker keeps it while it streams.

A Python ``str`` takes 1, 2 or 4 bytes per character, chosen by its widest character: one
emoji or CJK character in an answer makes every character of it cost 4 bytes, and a curly
quote or a dash (common in models' prose) makes it 2. Appending to a ``str`` that something
else also refers to copies all of it, so an answer grown delta by delta costs time quadratic
in its length. ``Utf8Text`` keeps the encoded bytes instead: about one byte per byte of the
answer's UTF-8, whatever its characters, and an append copies a bounded share of it.
"""

from __future__ import annotations

# Lone surrogates (a JSON "\ud83d" escape decodes to one) round-trip unchanged.
_ERRORS = "surrogatepass"


class Utf8Text:
    """Appended text as UTF-8 chunks, each more than twice the size of the one after it.

    A delta is first appended to ``parts`` (a list append is the cheapest thing a stream's
    hot path can do); every ``COMPACT_AT`` parts, and on every read, they are encoded into a
    chunk. Merging a chunk into the one before it once they are close in size copies each
    byte a logarithmic number of times over the text's life and leaves at most
    log2(bytes) + 1 chunks, so what is held is the text's UTF-8, a few dozen bytes per chunk
    and fewer than ``COMPACT_AT`` recent deltas. A read joins the chunks (and keeps the join
    as the only chunk); the ``str`` it returns is not kept.
    """

    __slots__ = ("_chunks", "parts")

    COMPACT_AT = 16

    def __init__(self, text: str = "") -> None:
        self._chunks: list[bytes] = [text.encode("utf-8", _ERRORS)] if text else []
        self.parts: list[str] = []  # deltas not yet encoded; a hot path may append here and call ``compact``

    def append(self, text: str) -> None:
        parts = self.parts
        parts.append(text)
        if len(parts) >= self.COMPACT_AT:
            self.compact()

    def compact(self) -> None:
        """Encode the pending deltas into a chunk."""
        parts = self.parts
        if not parts:
            return
        encoded = "".join(parts).encode("utf-8", _ERRORS)
        parts.clear()
        if not encoded:
            return
        chunks = self._chunks
        chunks.append(encoded)
        while len(chunks) > 1 and len(chunks[-2]) <= 2 * len(chunks[-1]):
            last = chunks.pop()
            chunks[-1] += last

    def encoded(self) -> bytes:
        """The whole text's UTF-8."""
        self.compact()
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks[0]
        if not chunks:
            return b""
        joined = b"".join(chunks)
        self._chunks = [joined]
        return joined

    def __str__(self) -> str:
        return self.encoded().decode("utf-8", _ERRORS)

    def __bool__(self) -> bool:
        return bool(self._chunks) or any(self.parts)

    def __repr__(self) -> str:
        return f"Utf8Text({str(self)!r})"


class Utf8Attr:
    """A ``str`` attribute kept as ``Utf8Text`` in the slot ``storage`` (reads decode, assignments encode).

    Installed on a slotted dataclass after the class is built (a class attribute of a
    field's name would clash with its slot), so ``__init__``, ``replace()``, ``__eq__`` and
    ``__repr__`` see a plain ``str``; code that grows the text appends to the slot's
    ``Utf8Text`` instead of ``+=`` (which would decode, copy and encode it all).
    """

    __slots__ = ("storage",)

    def __init__(self, storage: str) -> None:
        self.storage = storage

    def __get__(self, obj: object, owner: type | None = None) -> str:
        if obj is None:
            return ""  # read on the class itself (``Block.text``): the field's default
        return str(getattr(obj, self.storage))

    def __set__(self, obj: object, value: str) -> None:
        setattr(obj, self.storage, Utf8Text(value))


class Utf8Slots:
    """The slots behind a dataclass's ``text`` and ``arguments`` fields when they are ``Utf8Attr``."""

    __slots__ = ("_arguments", "_text")

    _text: Utf8Text
    _arguments: Utf8Text
