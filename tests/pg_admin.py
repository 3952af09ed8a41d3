"""Terminating PostgreSQL backends from beside the test database, as an operator or a failover would."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection


def pg_terminate(where: str, params: tuple[Any, ...]) -> int:
    """``pg_terminate_backend`` for the backends of ``pg_stat_activity`` matching ``where``,
    run on the server's ``postgres`` database (a connection the termination cannot hit)."""
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        password=settings.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        rows = admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where}", params)
        return len(rows.fetchall())
