"""Proxy keys: the command that issues one (printed once, only its hash stored) and revokes it,
and the admin, which never shows a raw key."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from streamrecover.models import ProxyKey
from streamrecover.proxy.keys import find_key, hash_key

pytestmark = pytest.mark.django_db


def issue(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("streamrecover_proxy_key", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue()


def test_the_command_prints_a_key_once_and_stores_only_its_hash(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("alice", password="x")
    raw, notice = issue("alice", "--model", "claude-*", "--max-tokens", "2000", "--max-concurrent", "2")
    assert "shown once" in notice
    key = ProxyKey.objects.get()
    assert key.user == user
    assert find_key(raw) == key
    assert raw.startswith(key.prefix)
    assert key.hashed == hash_key(raw)
    assert raw not in str(list(ProxyKey.objects.values()))
    assert (key.allowed_models, key.max_tokens, key.max_concurrent) == (["claude-*"], 2000, 2)
    assert issue("alice")[0] != raw  # every key is new


def test_revoke_ends_a_key(django_user_model: Any) -> None:
    django_user_model.objects.create_user("bob", password="x")
    raw, _ = issue("bob")
    out, _ = issue("--revoke", raw)
    assert "revoked" in out
    assert find_key(raw) is None
    assert ProxyKey.objects.get().revoked
    with pytest.raises(CommandError, match="no such key"):
        issue("--revoke", "sk-sr-not-a-key")


def test_unknown_user_and_missing_arguments_are_clear_errors() -> None:
    with pytest.raises(CommandError, match="no user 'nobody'"):
        issue("nobody")
    with pytest.raises(CommandError, match="USERNAME"):
        issue()


def test_an_inactive_users_key_is_refused(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("carol", password="x")
    raw, _ = issue("carol")
    user.is_active = False
    user.save()
    assert find_key(raw) is None


def test_the_admin_lists_keys_without_the_raw_key(admin_client: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_user("dave", password="x")
    raw, _ = issue("dave")
    key = ProxyKey.objects.get()
    listing = admin_client.get("/admin/streamrecover/proxykey/").content.decode()
    page = admin_client.get(f"/admin/streamrecover/proxykey/{key.pk}/change/").content.decode()
    assert key.prefix in listing
    assert raw not in listing + page
    assert key.hashed not in page
    admin_client.post("/admin/streamrecover/proxykey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    assert find_key(raw) is None
