"""Models and querysets: the sweeper's stale runs, terminal runs, recovered runs, ownership."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, Permission
from django.db import IntegrityError
from django.test import override_settings
from django.utils import timezone

from streamrecover.engine.sink import LLM_STREAM_CONTINUATION_COMPLETED, LLM_STREAM_INTERRUPTED
from streamrecover.models import ExhaustedRun, FailedRun, RecoveredRun, RecoveryEvent, Run

from .factories import make_attempt, make_event, make_message, make_run, make_thread, make_user

pytestmark = pytest.mark.django_db


def test_terminal_statuses() -> None:
    assert {"completed", "failed", "exhausted", "cancelled"} == Run.TERMINAL_STATUSES
    assert Run.TERMINAL_STATUSES.isdisjoint(Run.ACTIVE_STATUSES)
    assert set(Run.Status.values) == Run.TERMINAL_STATUSES | Run.ACTIVE_STATUSES


def test_active_and_terminal() -> None:
    runs = {status: make_run(status=status) for status in Run.Status.values}
    assert set(Run.objects.terminal()) == {runs[s] for s in Run.TERMINAL_STATUSES}
    assert set(Run.objects.active()) == {runs[s] for s in Run.ACTIVE_STATUSES}
    assert runs["completed"].is_terminal
    assert not runs["running"].is_terminal


def test_stale_runs_are_claimed_runs_without_a_recent_heartbeat() -> None:
    now = timezone.now()
    old = now - timedelta(seconds=60)
    stale = make_run(status="running", heartbeat_at=old)
    stale_recovering = make_run(status="recovering", heartbeat_at=old)
    never_beat = make_run(status="running", started_at=old)
    make_run(status="running", heartbeat_at=now - timedelta(seconds=5))  # alive
    make_run(status="running", started_at=now)  # just claimed, no beat yet
    make_run(status="completed", heartbeat_at=old)  # finished: not the sweeper's business
    make_run(status="queued", created=old)  # waiting in the queue, never claimed
    assert set(Run.objects.stale(now, 30)) == {stale, stale_recovering, never_beat}
    assert set(Run.objects.stale(now, 120)) == set()


def test_stale_defaults_to_setting() -> None:
    run = make_run(status="running", heartbeat_at=timezone.now() - timedelta(seconds=10))
    with override_settings(STREAMRECOVER={"STALE_AFTER_SECONDS": 30}):
        assert list(Run.objects.stale()) == []
    with override_settings(STREAMRECOVER={"STALE_AFTER_SECONDS": 5}):
        assert list(Run.objects.stale()) == [run]


def test_recovered_failed_and_exhausted_with_proxies() -> None:
    recovered = make_run(status="completed")
    make_event(recovered, LLM_STREAM_INTERRUPTED)
    make_event(recovered, LLM_STREAM_CONTINUATION_COMPLETED)
    make_event(recovered, LLM_STREAM_CONTINUATION_COMPLETED)  # two recoveries: still one run
    interrupted_only = make_run(status="failed")
    make_event(interrupted_only, LLM_STREAM_INTERRUPTED)
    exhausted = make_run(status="exhausted")
    make_run(status="completed")

    assert list(Run.objects.recovered()) == [recovered]
    assert list(RecoveredRun.objects.all()) == [RecoveredRun.objects.get(pk=recovered.pk)]
    assert [r.pk for r in FailedRun.objects.all()] == [interrupted_only.pk]
    assert [r.pk for r in ExhaustedRun.objects.all()] == [exhausted.pk]
    assert list(Run.objects.failed()) == [interrupted_only]


def test_for_owner_visible_to_and_cancellable_by() -> None:
    """Someone else's runs by the admin's permissions, never by ``is_staff`` alone."""
    alice, bob = make_user(), make_user()
    staff = make_user(is_staff=True)
    viewer, changer = make_user(is_staff=True), make_user(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    changer.user_permissions.add(Permission.objects.get(codename="change_run"))
    root = make_user(is_staff=True, is_superuser=True)
    mine = make_run(owner=alice)
    make_run(owner=bob)
    assert list(Run.objects.for_owner(alice)) == [mine]
    assert list(Run.objects.for_owner(AnonymousUser())) == []
    assert list(Run.objects.for_owner(None)) == []
    assert list(Run.objects.visible_to(alice)) == [mine]
    assert list(Run.objects.cancellable_by(alice)) == [mine]
    assert list(Run.objects.visible_to(staff)) == []
    assert list(Run.objects.cancellable_by(staff)) == []
    assert Run.objects.visible_to(viewer).count() == 2
    assert list(Run.objects.cancellable_by(viewer)) == []
    assert Run.objects.visible_to(changer).count() == 2  # change implies view, as in the admin
    assert Run.objects.cancellable_by(changer).count() == 2
    assert Run.objects.visible_to(root).count() == Run.objects.cancellable_by(root).count() == 2
    assert list(Run.objects.visible_to(AnonymousUser())) == []


def test_message_positions_are_unique_per_thread() -> None:
    thread = make_thread()
    make_message(thread, position=0)
    make_message(make_thread(), position=0)  # another thread may reuse it
    with pytest.raises(IntegrityError):
        make_message(thread, position=0)


def test_attempt_index_is_unique_per_run() -> None:
    run = make_run()
    make_attempt(run, index=0)
    with pytest.raises(IntegrityError):
        make_attempt(run, index=0)


def test_recovery_events_are_append_only() -> None:
    event = make_event()
    event.name = "something_else"
    with pytest.raises(ValueError, match="append-only"):
        event.save()


def test_event_queryset_window_and_names() -> None:
    run = make_run()
    now = timezone.now()
    old = make_event(run, LLM_STREAM_INTERRUPTED, created=now - timedelta(days=2))
    recent = make_event(run, LLM_STREAM_INTERRUPTED, created=now - timedelta(hours=1))
    completed = make_event(run, LLM_STREAM_CONTINUATION_COMPLETED, created=now)
    window = RecoveryEvent.objects.in_window(now - timedelta(days=1))
    assert set(window) == {recent, completed}
    assert list(RecoveryEvent.objects.in_window(now - timedelta(days=3), now - timedelta(days=1))) == [old]
    assert set(window.named(LLM_STREAM_INTERRUPTED)) == {recent}
    assert RecoveryEvent.objects.named(LLM_STREAM_INTERRUPTED, LLM_STREAM_CONTINUATION_COMPLETED).count() == 3
    assert RecoveryEvent.objects.for_model("fake", "fake-model").count() == 3
    assert RecoveryEvent.objects.for_model("openai").count() == 0


def test_deleting_a_run_removes_its_rows_but_keeps_thread_messages() -> None:
    run = make_run()
    make_attempt(run)
    make_event(run)
    message = make_message(run.thread, run=run)
    run.delete()
    message.refresh_from_db()
    assert message.run is None


def test_run_options_and_error_are_scrubbed_on_save() -> None:
    secret = "sk-ant-api03-test-NOT-A-REAL-KEY-0123456789"
    providers = {"anthropic": {"ADAPTER": "anthropic", "BASE_URL": "https://api.anthropic.com", "API_KEY": secret}}
    tools = [{"name": "login", "input_schema": {"properties": {"password": {"type": "string"}}}}]
    with override_settings(STREAMRECOVER={"PROVIDERS": providers}):
        run = make_run(options={"system": f"key {secret}", "max_tokens": 512, "tools": tools, "api_key": secret})
        run.error_message = f"401: {secret}"
        run.save()
    run.refresh_from_db()
    assert secret not in str(run.options)
    assert secret not in run.error_message
    assert run.options["max_tokens"] == 512
    assert run.options["tools"] == tools
