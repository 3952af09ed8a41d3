"""A model name stays a model name: one that would climb out of its URL path (``..``) or cut it
short (``?``, ``#``) is refused by the JSON API, the chat form and the proxy, so a key limited to
some models reaches no other and nobody aims the server's provider key at another endpoint; the
adapters escape the name in the path besides. Real names with ``/`` and ``:`` still work."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.test import Client, override_settings
from django.urls import include, path, reverse

from streamrecover.engine.contract import ModelRequest, ProviderConfig
from streamrecover.models import Run
from streamrecover.providers.gemini import GeminiAdapter
from streamrecover.providers.modelname import model_name_problem
from streamrecover.providers.openai_chat import OpenAIChatAdapter
from streamrecover.proxy.keys import issue_key

from .factories import make_user

RUNS = "/streamrecover/api/runs/"
urlpatterns = [  # the app's own chat page, as a host mounts it (the demo's form has no model field)
    path("streamrecover/", include("streamrecover.urls")),
    path("chat/", include("streamrecover.chat.urls")),
]
LEGITIMATE = ["meta-llama/Llama-3.1-8B-Instruct", "llama3:8b", "accounts/fireworks/models/x", "gemini-2.0-flash"]
CLIMBING = [
    "gemini-2.0-flash/../gemini-2.5-pro",
    "x/../../../v1/cachedContents?",
    "..",
    "a/./b",
    "m?alt=json",
    "m#frag",
    "m%2F..",
    "m\\..",
    "m n",
    "m\tn",
    "m\x7f",
]


@pytest.mark.parametrize("name", CLIMBING)
def test_names_that_leave_their_path_are_refused(name: str) -> None:
    assert model_name_problem(name)


@pytest.mark.parametrize("name", LEGITIMATE)
def test_real_names_with_slashes_and_colons_pass(name: str) -> None:
    assert model_name_problem(name) is None


# ---- the adapters escape the name, whatever reaches them -----------------------------------


def test_the_gemini_adapter_keeps_the_model_in_its_own_path_segments() -> None:
    adapter = GeminiAdapter(ProviderConfig(name="gemini", base_url="https://g.example", api_key="k"))
    built = adapter.build_request(ModelRequest(model="x/../../v1/cachedContents?", messages=[]))
    path = httpx.URL(built.url).raw_path.decode()
    assert path == "/v1beta/models/x/%2E%2E/%2E%2E/v1/cachedContents%3F:streamGenerateContent?alt=sse"
    ok = adapter.build_request(ModelRequest(model="tunedModels/my-model-1", messages=[]))
    assert httpx.URL(ok.url).raw_path.decode() == "/v1beta/models/tunedModels/my-model-1:streamGenerateContent?alt=sse"


def test_the_azure_deployment_is_one_path_segment() -> None:
    config = ProviderConfig("openai", "https://r.example", "k", azure=True, azure_api_version="2024-10-21")
    built = OpenAIChatAdapter(config).build_request(ModelRequest(model="..", messages=[]))
    assert httpx.URL(built.url).raw_path.decode().startswith("/openai/deployments/%2E%2E/chat/completions?")


# ---- the JSON API and the chat form ------------------------------------------------------------


def _client() -> Client:
    client = Client()
    client.force_login(make_user())
    return client


@pytest.mark.parametrize("name", ["x/../../../v1/cachedContents?", "m?alt=json", "a/../b"])
@pytest.mark.django_db
def test_the_api_answers_400_for_a_name_that_leaves_its_path(name: str) -> None:
    response = _client().post(RUNS, json.dumps({"prompt": "hi", "model": name}), content_type="application/json")
    assert response.status_code == 400
    assert "'model'" in response.json()["error"]
    assert not Run.objects.exists()


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_the_chat_form_refuses_it_too() -> None:
    client = _client()
    url = reverse("streamrecover_chat:chat")
    response = client.post(url, {"prompt": "hi", "model": "a/../b"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert "'model'" in response.json()["error"]
    page = client.post(url, {"prompt": "hi", "model": "a/../b"})  # without JavaScript: the form again, with why
    assert page.status_code == 400
    assert "&#x27;model&#x27; cannot have" in page.content.decode()
    assert not Run.objects.exists()


@pytest.mark.parametrize("name", LEGITIMATE)
@pytest.mark.django_db
def test_the_api_takes_real_names(name: str) -> None:
    response = _client().post(RUNS, json.dumps({"prompt": "hi", "model": name}), content_type="application/json")
    assert response.status_code == 201, response.content
    assert Run.objects.get().model == name


# ---- the proxy: a key's model limit holds ----------------------------------------------------


class _Upstream(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append(self.path)
        body = json.dumps({"candidates": [{"content": {"parts": [{"text": "hi"}]}}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gemini_upstream() -> Iterator[str]:
    """A stand-in for Gemini that records the path of every request it gets."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Upstream.seen.clear()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.django_db
def test_a_key_limited_to_flash_cannot_reach_pro_through_dot_segments(gemini_upstream: str, stream: bool) -> None:
    providers = {"gemini": {"ADAPTER": "gemini", "BASE_URL": gemini_upstream, "API_KEY": "AIza" + "0" * 35}}
    settings = {"PROVIDERS": providers, "DEFAULT_PROVIDER": "gemini", "PROXY_ANTHROPIC_PROVIDER": "gemini"}
    with override_settings(STREAMRECOVER=settings):
        _, raw = issue_key(make_user(), allowed_models=["gemini-2.0-flash*"])
        body = {
            "model": "gemini-2.0-flash/../gemini-2.5-pro",
            "max_tokens": 10,
            "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }
        response = Client().post(
            "/streamrecover/proxy/v1/messages", json.dumps(body), content_type="application/json", HTTP_X_API_KEY=raw
        )
    assert response.status_code == 400
    error = json.loads(response.content)
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("model: ")
    assert _Upstream.seen == []
    assert not Run.objects.exists()
