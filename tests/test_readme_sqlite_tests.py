"""The README's one-process settings, applied to what ``startproject`` writes, give a host's tests an
SQLite database in a file. In Django's default in-memory one (shared cache) a run's thread and the
test polling its status fail at once with ``database table is locked`` instead of waiting: the
README's "Testing your project" example failed about one time in seven that way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.sqlite3.base import DatabaseWrapper

from .test_readme_integration import readme_blocks


def startproject_settings(base_dir: Path) -> dict[str, Any]:
    """The names of a fresh ``startproject`` settings module that the README's block uses."""
    return {
        "BASE_DIR": base_dir,
        "INSTALLED_APPS": ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes"],
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": base_dir / "db.sqlite3"}},
    }


def test_the_one_process_settings_give_the_tests_an_sqlite_database_in_a_file(tmp_path: Path) -> None:
    namespace = startproject_settings(tmp_path)
    (block,) = [b for b in readme_blocks("one-process") if b.target == "mysite/settings.py" and b.mode != "both"]
    exec(block.body, namespace)  # appended to settings.py, as the README says
    database = namespace["DATABASES"]["default"]
    wrapper = DatabaseWrapper({**database, "TEST": {"NAME": None, **database.get("TEST", {})}}, "default")
    test_name = wrapper.creation._get_test_db_name()
    # Django's default is "file:memorydb_default?mode=memory&cache=shared"
    assert not wrapper.creation.is_in_memory_db(test_name)
    assert Path(test_name).parent == tmp_path
    assert database["OPTIONS"]["transaction_mode"] == "IMMEDIATE"  # and it waits for the write lock there too
