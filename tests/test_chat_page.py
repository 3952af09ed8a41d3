"""The opt-in chat page (``streamrecover.chat``): a host mounts it alone, its form posts (a run is
created and the browser redirected to the thread, no JavaScript needed), the page without
JavaScript shows the committed answer, and a host's template overrides the app's."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import include, path, reverse

from streamrecover.models import Run
from streamrecover.testing.host import wait_for

from .factories import make_message, make_run, make_thread, make_user

pytestmark = pytest.mark.django_db(transaction=True)

urlpatterns = [
    path("accounts/login/", lambda request: None, name="login"),
    path("streamrecover/", include("streamrecover.urls")),
    path("chat/", include("streamrecover.chat.urls")),
]

HOST = override_settings(ROOT_URLCONF=__name__)
HOST_TEMPLATES = Path(__file__).resolve().parent / "host_templates"


def logged_in(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


@HOST
def test_the_form_posts_and_without_javascript_the_post_creates_the_run_and_redirects_to_the_thread():
    user = make_user()
    client = logged_in(user)
    page = client.get(reverse("streamrecover_chat:chat"))
    html = page.content.decode()
    assert '<form id="sr-form" class="sr-form" method="post" action="/chat/"' in html
    assert "csrfmiddlewaretoken" in html
    token = client.cookies["csrftoken"].value

    response = client.post("/chat/", {"prompt": "Hello [[words=20]]", "csrfmiddlewaretoken": token})

    assert response.status_code == 302
    run = Run.objects.get(thread__owner=user)
    assert response["Location"] == reverse("streamrecover_chat:chat-thread", args=[run.thread_id])
    assert "prompt" not in response["Location"]
    assert "csrf" not in response["Location"]
    assert wait_for(run.pk).status == "completed"
    thread_page = client.get(response["Location"])
    shown = thread_page.content.decode()
    assert "Hello [[words=20]]" in shown  # the committed messages, rendered on the server
    assert 'data-role="assistant"' in shown
    assert 'http-equiv="refresh"' not in shown  # the run is over: no more reloading

    follow_up = client.post(response["Location"], {"prompt": "And more", "csrfmiddlewaretoken": token})
    assert follow_up.status_code == 302
    second = Run.objects.exclude(pk=run.pk).get(thread_id=run.thread_id)  # in the same thread
    assert wait_for(second.pk).status == "completed"


@HOST
def test_the_post_needs_its_csrf_token_and_a_prompt_and_answers_json_to_the_script():
    client = logged_in(make_user())
    client.get("/chat/")
    assert client.post("/chat/", {"prompt": "no token"}).status_code == 403
    token = client.cookies["csrftoken"].value
    empty = client.post("/chat/", {"prompt": "  ", "csrfmiddlewaretoken": token})
    assert empty.status_code == 400
    assert "This field is required." in empty.content.decode()
    assert not Run.objects.exists()
    answer = client.post(
        "/chat/", {"prompt": "Hi [[words=5]]", "csrfmiddlewaretoken": token}, headers={"accept": "application/json"}
    )
    assert answer.status_code == 201
    body = answer.json()
    assert set(body) == {"run_id", "thread_id", "title", "status", "ws_url"}
    assert body["title"] == "Hi [[words=5]]"  # the thread's, for the sidebar
    wait_for(body["run_id"])


@HOST
def test_the_form_stores_the_prompt_as_written_whitespace_and_all():
    user = make_user()
    client = logged_in(user)
    client.get("/chat/")
    token = client.cookies["csrftoken"].value
    written = "  indented code:\n    x = 1\n\n"
    response = client.post("/chat/", {"prompt": written, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    run = Run.objects.get(thread__owner=user)
    wait_for(run.pk)
    stored = run.thread.messages.get(role="user").content
    text = stored if isinstance(stored, str) else "".join(block["text"] for block in stored)
    assert text == written
    assert run.thread.title == "indented code: x = 1"  # the sidebar's label is on one line


@HOST
def test_the_page_needs_a_login_and_shows_only_the_users_threads():
    assert Client().get("/chat/")["Location"].startswith("/accounts/login/")
    user = make_user()
    theirs = make_thread(owner=make_user(), title="theirs")
    client = logged_in(user)
    assert client.get(f"/chat/threads/{theirs.pk}/").status_code == 404
    assert client.post(f"/chat/threads/{theirs.pk}/", {"prompt": "x"}).status_code in (403, 404)


@HOST
def test_a_hosts_template_overrides_the_apps_base():
    templates = [{**settings.TEMPLATES[0], "DIRS": [HOST_TEMPLATES]}]
    with override_settings(TEMPLATES=templates):
        page = logged_in(make_user()).get("/chat/")
    html = page.content.decode()
    assert '<p id="host-banner">My Host Project</p>' in html
    assert 'class="host-layout"' in html
    assert 'id="sr-form"' in html  # the app's chat inside the host's layout
    assert "streamrecover/chat.js" in html


class _ShownText(HTMLParser):
    """The text a reader sees in each element of one class."""

    def __init__(self, css_class: str) -> None:
        super().__init__()
        self.css_class = css_class
        self.found: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._depth:
            self._depth += 1
        elif self.css_class in (dict(attrs).get("class") or "").split():
            self._depth = 1
            self.found.append("")

    def handle_endtag(self, tag: str) -> None:
        self._depth = max(self._depth - 1, 0)

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.found[-1] += data


def shown(html: str, css_class: str) -> list[str]:
    parser = _ShownText(css_class)
    parser.feed(html)
    return parser.found


@HOST
def test_without_javascript_a_tool_calls_input_and_result_are_shown_as_json_like_the_script_shows_them():
    user = make_user()
    thread = make_thread(owner=user)
    make_message(thread, role="user", content=[{"type": "text", "text": "Weather in Zürich?"}])
    tool_call = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "get_weather",
        "input": {"city": "Zürich <b>&", "unit": "°C"},
    }
    make_message(thread, role="assistant", content=[{"type": "text", "text": "Let me check."}, tool_call])
    result = [{"text": "Sunny, 22 °C", "type": "text"}]  # stored as written, on every database
    make_message(thread, role="user", content=[{"type": "tool_result", "tool_use_id": "toolu_01", "content": result}])

    html = logged_in(user).get(f"/chat/threads/{thread.pk}/").content.decode()

    assert shown(html, "sr-tool") == ['\U0001f527 get_weather({"city":"Zürich <b>&","unit":"°C"})']
    assert shown(html, "sr-tool-result") == ['\u21b3 [{"text":"Sunny, 22 °C","type":"text"}]']
    assert "&lt;b&gt;&amp;" in html  # escaped by the template, never markup
    # the tool result rides in a user turn (the provider's shape), but the reader did not write it
    assert shown(html, "sr-role") == ["user", "assistant", "tool results"]
    assert "{'city'" not in html


@HOST
def test_a_page_opened_while_its_run_recovers_says_the_stream_is_reconnecting_script_or_not():
    user = make_user()
    thread = make_thread(owner=user)
    make_message(thread, role="user", content=[{"type": "text", "text": "A long story"}])
    make_run(owner=user, thread=thread, status=Run.Status.RECOVERING)

    html = logged_in(user).get(f"/chat/threads/{thread.pk}/").content.decode()

    assert shown(html, "sr-recovery") == ["Stream interrupted \u2014 reconnecting\u2026"]
    assert '<span id="sr-recovery" class="sr-recovery" role="status" data-phase="backoff">' in html  # not hidden


@HOST
def test_without_javascript_a_refused_message_stays_in_the_box_to_send_again():
    """A thread busy with a run: the page says so (409) and, before, dropped what had been typed."""
    user = make_user()
    thread = make_thread(owner=user)
    make_message(thread, role="user", content=[{"type": "text", "text": "A long story"}])
    make_run(owner=user, thread=thread, status=Run.Status.RUNNING)
    client = logged_in(user)
    client.get(f"/chat/threads/{thread.pk}/")
    token = client.cookies["csrftoken"].value
    typed = "My next question, <b>two</b> lines\nlong"

    refused = client.post(f"/chat/threads/{thread.pk}/", {"prompt": typed, "csrfmiddlewaretoken": token})

    assert refused.status_code == 409
    html = refused.content.decode()
    assert "This thread has a run in progress" in html
    (box,) = re.findall(r'<textarea id="sr-prompt"[^>]*>(.*?)</textarea>', html, re.DOTALL)
    assert unescape(box) == "\n" + typed  # a browser drops the one newline after the tag
    assert "<b>" not in box  # escaped: text, never markup
