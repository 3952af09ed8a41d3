"""An API key given in settings reaches no log line, no event row, no stored request, no
checkpoint and no page (API, chat page, admin), through a whole run with an interruption and a
provider error."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import structlog
from django.core import serializers
from django.test import Client, override_settings
from django.urls import reverse

from streamrecover import starter
from streamrecover.models import Attempt, Message, RecoveryEvent, Run, StreamCheckpoint
from streamrecover.proxy.keys import issue_key
from streamrecover.runs import lifecycle
from streamrecover.runs.checkpoints import DjangoCheckpointStore
from streamrecover.testing.fake.local import local_fake_server
from streamrecover.testing.host import wait_for

from .factories import make_user
from .proxy_helpers import daphne_url, proxy_settings

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


GOOGLE_KEY = "AIzaSyD-THIS-IS-A-SECRET-KEY-0123456789"


def test_a_key_read_with_a_trailing_newline_is_sent_stripped_and_stored_nowhere(settings, django_user_model):
    """A key read from a secrets file ends in a newline. Sent as it is, the HTTP client refuses
    the header with an error quoting the key escaped (``...\\n``), which reached the proxy's
    client, the run and its attempts. It is sent without the newline: the answer arrives."""
    raw = issue_key(django_user_model.objects.create_user("newline", password="x"))[1]
    fake = local_fake_server()
    provider = {"ADAPTER": "gemini", "BASE_URL": fake.base_url, "API_KEY": GOOGLE_KEY + "\n"}
    configured = proxy_settings(
        settings.STREAMRECOVER, PROVIDERS={"gem": provider}, PROXY_ANTHROPIC_PROVIDER="gem", MAX_REQUEST_RETRIES=0
    )
    body = {"model": "gemini-2.5-flash", "max_tokens": 200, "stream": True}
    with override_settings(STREAMRECOVER=configured):
        response = httpx.post(
            daphne_url() + "/streamrecover/proxy/v1/messages",
            headers={"x-api-key": raw},
            json={**body, "messages": [{"role": "user", "content": "Tell me about rivers [[words=9]]"}]},
            timeout=60,
        )
        run = Run.objects.get()
        report = wait_for(str(run.pk))
    assert response.status_code == 200, response.text
    assert report.status == "completed", report.error
    assert "message_stop" in response.text
    stored = [
        response.text,
        serializers.serialize("json", Run.objects.all()),
        serializers.serialize("json", Attempt.objects.all()),
        serializers.serialize("json", RecoveryEvent.objects.all()),
    ]
    for blob in stored:
        assert GOOGLE_KEY not in blob
    assert Attempt.objects.get(run=run).request["headers"]["x-goog-api-key"] == "[redacted]"
