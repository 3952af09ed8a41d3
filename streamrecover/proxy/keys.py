"""Proxy keys: issuing (the raw key shown once), revoking, and finding the key a request carries."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from ..models import ProxyKey

KEY_PREFIX = "sk-sr-"  # ``sk-`` shaped: the log scrubber already cuts it from any log line
SHOWN_CHARS = 12  # the key's first characters, stored to tell keys apart


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def issue_key(
    user: Any,
    *,
    name: str = "",
    allowed_models: Sequence[str] = (),
    max_tokens: int | None = None,
    max_concurrent: int | None = None,
) -> tuple[ProxyKey, str]:
    """A new key for ``user``: the stored row and the raw key, which nothing keeps."""
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ProxyKey.objects.create(
        user=user,
        name=name,
        prefix=raw[:SHOWN_CHARS],
        hashed=hash_key(raw),
        allowed_models=list(allowed_models),
        max_tokens=max_tokens,
        max_concurrent=max_concurrent,
    )
    return key, raw


def revoke_key(raw: str) -> ProxyKey | None:
    """Revoke the key ``raw``; None when no such key exists. Revoking twice keeps the first time."""
    key = ProxyKey.objects.filter(hashed=hash_key(raw.strip())).first()
    if key is not None and key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def find_key(raw: str) -> ProxyKey | None:
    """The live key ``raw`` names (not revoked, its user active), or None."""
    if not raw:
        return None
    key = ProxyKey.objects.select_related("user").filter(hashed=hash_key(raw), revoked_at__isnull=True).first()
    if key is None or not key.user.is_active:
        return None
    return key
