"""The ``streamrecover_proxy_key USERNAME`` command: issue a healing-endpoint key (shown once), or ``--revoke KEY``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...proxy.keys import issue_key, revoke_key
from ..arguments import positive_int


class Command(BaseCommand):
    help = "Issue a key for the healing endpoint and print it once, or revoke one with --revoke KEY."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?", help="the user the key belongs to")
        parser.add_argument("--revoke", metavar="KEY", help="revoke this key instead of issuing one")
        parser.add_argument("--name", default="", help="a name to tell the key apart in the admin")
        parser.add_argument(
            "--model", action="append", default=[], dest="models", help="a model (or pattern) it may use; repeatable"
        )
        parser.add_argument("--max-tokens", type=positive_int, help="the largest max_tokens a request may ask")
        parser.add_argument("--max-concurrent", type=positive_int, help="how many streams it may have open at once")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["revoke"]:
            key = revoke_key(opts["revoke"])
            if key is None:
                raise CommandError("no such key")
            self.stdout.write(f"revoked {key.prefix}… of {key.user}")
            return
        if not opts["username"]:
            raise CommandError("give a USERNAME to issue a key for, or --revoke KEY")
        user_model = get_user_model()
        try:
            user = user_model._default_manager.get_by_natural_key(opts["username"])
        except user_model.DoesNotExist:
            raise CommandError(f"no user {opts['username']!r}") from None
        _, raw = issue_key(
            user,
            name=opts["name"],
            allowed_models=opts["models"],
            max_tokens=opts["max_tokens"],
            max_concurrent=opts["max_concurrent"],
        )
        self.stderr.write("The key is shown once; only its hash is stored.")
        self.stdout.write(raw)
