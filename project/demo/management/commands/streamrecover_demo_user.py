"""``manage.py streamrecover_demo_user``: the demo's login, created once (idempotent)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the demo user (default demo / demo) unless it exists."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo", help="the demo user's name (default demo)")
        parser.add_argument("--password", default="demo", help="its password (default demo)")

    def handle(self, *args: Any, **opts: Any) -> None:
        users = get_user_model()
        username = opts["username"]
        if users.objects.filter(**{users.USERNAME_FIELD: username}).exists():
            self.stdout.write(f"demo user {username!r} exists")
            return
        # create_user, not a form: the demo password is deliberately short.
        users.objects.create_user(**{users.USERNAME_FIELD: username}, password=opts["password"])
        self.stdout.write(f"demo user {username!r} created")
