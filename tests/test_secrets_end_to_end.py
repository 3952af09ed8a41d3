"""An API key given in settings reaches no log line, no event row, no stored request, no
checkpoint and no page (API, chat page, admin), through a whole run with an interruption and a
provider error."""

from __future__ import annotations

import asyncio
import json

import pytest
import structlog
from django.core import serializers
from django.test import Client, override_settings
from django.urls import reverse

from streamrecover import starter
from streamrecover.models import Attempt, Message, RecoveryEvent, Run, StreamCheckpoint
from streamrecover.runs import lifecycle
from streamrecover.runs.checkpoints import DjangoCheckpointStore

from .factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-ant-api03-THIS-IS-A-SECRET-KEY-0123456789"


def test_api_key_never_reaches_logs_rows_requests_or_checkpoints(fake_server, settings, monkeypatch, caplog):
    written: list[str] = []
    original_put = DjangoCheckpointStore.put

    async def spy_put(self, checkpoint):
        await original_put(self, checkpoint)
        row = await StreamCheckpoint.objects.aget(run_id=checkpoint.run_id)
        written.append(json.dumps(row.data))

    monkeypatch.setattr(DjangoCheckpointStore, "put", spy_put)
    fake_server.set_faults("secrets", ["cut:bytes=1500", "status:429,retry_after=0", "status:401"])
    providers = {
        "fake": {
            "ADAPTER": "anthropic",
            "BASE_URL": fake_server.base_url,
            "API_KEY": SECRET,
            "EXTRA_HEADERS": {"x-fake-scenario": "secrets"},
        }
    }
    with (
        override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROVIDERS": providers}),
        structlog.testing.capture_logs() as logs,
    ):
        owner = make_user()
        run = lifecycle.create_run(
            prompt=f"Say it [[words=80]] {SECRET[:6]}", owner=owner, provider="fake", model="claude-3"
        )
        result = asyncio.run(starter.execute_here(str(run.pk)))
    assert result is not None
    assert result.status == "failed"  # the 401 on the continuation is permanent
    assert written, "no checkpoint was written"

    everything = [
        json.dumps(logs, default=str),
        caplog.text,
        *written,
        serializers.serialize("json", Run.objects.all()),
        serializers.serialize("json", Attempt.objects.all()),
        serializers.serialize("json", RecoveryEvent.objects.all()),
        serializers.serialize("json", Message.objects.all()),
        serializers.serialize("json", StreamCheckpoint.objects.all()),
    ]
    for blob in everything:
        assert SECRET not in blob
    # the request as sent was stored, with the key header redacted rather than dropped
    request = Attempt.objects.filter(run=run).order_by("index").first().request
    assert request["headers"]["x-api-key"] == "[redacted]"
    # the fake provider did receive the key (so it was really sent, just never stored)
    assert any(entry.status == 401 for entry in fake_server.log_for("secrets"))
    # ... and no page shows it: the owner's API and chat page, every admin page of the run
    user, staff = Client(), Client()
    user.force_login(owner)
    staff.force_login(make_user(is_staff=True, is_superuser=True))
    attempt = Attempt.objects.filter(run=run).order_by("index").first()
    event = RecoveryEvent.objects.filter(run=run).first()
    pages = [
        user.get(reverse("streamrecover:api-run", args=[run.pk])),
        user.get(reverse("streamrecover:api-thread", args=[run.thread_id])),
        user.get(reverse("demo:chat-thread", args=[run.thread_id])),
        staff.get(reverse("admin:streamrecover_run_change", args=[run.pk])),
        staff.get(reverse("admin:streamrecover_attempt_changelist")),
        staff.get(reverse("admin:streamrecover_attempt_change", args=[attempt.pk])),
        staff.get(reverse("admin:streamrecover_recoveryevent_changelist")),
        staff.get(reverse("admin:streamrecover_recoveryevent_change", args=[event.pk])),
    ]
    for page in pages:
        assert page.status_code == 200, page
        assert SECRET not in page.content.decode(), page
    assert "[redacted]" in pages[5].content.decode()  # the attempt's page shows the request, key redacted
