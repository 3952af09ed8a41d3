"""The models and the committed migration agree, and the named indexes exist in PostgreSQL."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from streamrecover.models import Attempt, Message, RecoveryEvent, Run, StreamCheckpoint, Thread


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    # Exits with status 1 (SystemExit) when a model change has no migration.
    call_command("makemigrations", "streamrecover", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_named_indexes_and_constraints_exist_in_the_database() -> None:
    expected = {
        Thread: {"sr_thread_owner_created"},
        Run: {"sr_run_status_created", "sr_run_provider_model_created", "sr_run_status_heartbeat"},
        Message: {"sr_message_thread_pos_uniq"},
        Attempt: {"sr_attempt_run_index_uniq", "sr_attempt_cause_started"},
        StreamCheckpoint: {"sr_checkpoint_updated"},
        RecoveryEvent: {"sr_event_name_created", "sr_event_prov_model_created"},
    }
    with connection.cursor() as cursor:
        for model, names in expected.items():
            found = set(connection.introspection.get_constraints(cursor, model._meta.db_table))
            assert names <= found, (model.__name__, names - found)


def test_one_initial_migration_before_the_first_release() -> None:
    """0.1.0 ships one migration: the schema, no data migration (no row predates a column)."""
    from django.db import migrations
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    names = sorted(name for app, name in loader.disk_migrations if app == "streamrecover")
    assert names == ["0001_initial"]
    initial = loader.disk_migrations[("streamrecover", "0001_initial")]
    assert initial.initial
    assert not [op for op in initial.operations if isinstance(op, migrations.RunPython | migrations.RunSQL)]
