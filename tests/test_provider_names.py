"""Any provider name configured in ``STREAMRECOVER["PROVIDERS"]`` works at every entry point (the
command line, the JSON API, the chat page), not only the adapter names; an unknown name is
refused there with the configured ones listed, and nothing is stored."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.urls import include, path

from streamrecover.models import Attempt, Run
from streamrecover.testing.fake import FakeProviderServer
from streamrecover.testing.host import wait_for

from .factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

urlpatterns = [
    path("accounts/login/", lambda request: None, name="login"),
    path("streamrecover/", include("streamrecover.urls")),
    path("chat/", include("streamrecover.chat.urls")),
]
NAME = "house-gemini"  # a name of the host's choosing, served in the Gemini wire format
MODEL = "gemini-2.5-flash"


@pytest.fixture
def configured(fake_server: FakeProviderServer) -> Iterator[str]:
    """Settings with ``house-gemini`` (the Gemini adapter, pointed at the fake) as one provider
    among the others; yields its fake scenario, which cuts the first answer once."""
    scenario = uuid.uuid4().hex
    fake_server.set_faults(scenario, ["cut:events=6"])
    provider = {
        "ADAPTER": "gemini",
        "BASE_URL": fake_server.base_url,
        "API_KEY": "AIza-house-key",
        "EXTRA_HEADERS": {"x-fake-scenario": scenario},
    }
    value = {**settings.STREAMRECOVER, "BACKOFF_SCALE": 0, "DEFAULT_MODEL": MODEL}
    value["PROVIDERS"] = {**value.get("PROVIDERS", {}), NAME: provider}
    with override_settings(STREAMRECOVER=value, ROOT_URLCONF=__name__):
        yield scenario


def _completed_through_gemini(run: Run, fake_server: FakeProviderServer, scenario: str) -> None:
    assert run.provider == NAME
    assert run.model == MODEL
    log = fake_server.log_for(scenario)
    assert [e.understood_as for e in log] == ["fresh", "continue_message"]
    assert all(":streamGenerateContent" in e.path for e in log)


def test_the_command_line_takes_a_configured_name(configured: str, fake_server: FakeProviderServer) -> None:
    out = io.StringIO()
    call_command("streamrecover_run", "--provider", NAME, "--prompt", "A tale [[words=40]]", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["status"] == "completed"
    _completed_through_gemini(Run.objects.get(pk=doc["run_id"]), fake_server, configured)
    assert "AIza-house-key" not in out.getvalue()
    stored = [a.request for a in Attempt.objects.filter(run_id=doc["run_id"])]
    assert [r["headers"]["x-goog-api-key"] for r in stored] == ["[redacted]", "[redacted]"]
    assert "AIza-house-key" not in json.dumps(stored)


def test_the_command_line_lists_the_configured_names(configured: str) -> None:
    with pytest.raises(CommandError, match=rf"unknown provider 'gemini-house'.*{NAME}"):
        call_command("streamrecover_run", "--provider", "gemini-house", "--prompt", "x", "--json", stdout=io.StringIO())
    assert not Run.objects.exists()


def _client() -> Client:
    client = Client()
    client.force_login(make_user())
    return client


def test_the_json_api_takes_a_configured_name(configured: str, fake_server: FakeProviderServer) -> None:
    client = _client()
    body = {"prompt": "A tale [[words=40]]", "provider": NAME}
    response = client.post("/streamrecover/api/runs/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    assert wait_for(response.json()["run_id"]).status == "completed"
    _completed_through_gemini(Run.objects.get(pk=response.json()["run_id"]), fake_server, configured)
    unknown = {"prompt": "x", "provider": "gemini-house"}
    refused = client.post("/streamrecover/api/runs/", json.dumps(unknown), content_type="application/json")
    assert refused.status_code == 400
    assert NAME in refused.json()["error"]
    assert Run.objects.count() == 1


def test_the_chat_page_offers_and_takes_a_configured_name(configured: str, fake_server: FakeProviderServer) -> None:
    client = _client()
    page = client.get("/chat/").content.decode()
    assert f'<option value="{NAME}">{NAME}</option>' in page
    assert '<option value="fake" selected>fake</option>' in page  # the default provider is preselected
    response = client.post("/chat/", {"prompt": "A tale [[words=40]]", "provider": NAME})
    assert response.status_code == 302
    run = Run.objects.get()
    assert wait_for(run.pk).status == "completed"
    _completed_through_gemini(run, fake_server, configured)
    refused = client.post("/chat/", {"prompt": "x", "provider": "gemini-house"})
    assert refused.status_code == 400
    shown: Any = refused.content.decode()
    assert "Unknown provider" in shown
    assert NAME in shown
    assert Run.objects.count() == 1
