"""The demo chat page rendered on the server (no browser): what a reloaded page says of a recovery
the fake's fault scenarios caused, and the fault chooser keeping the visitor's choice."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from streamrecover.models import Run
from streamrecover.testing.host import wait_for

from .factories import make_user
from .test_chat_page import shown

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in() -> Client:
    client = Client()
    client.force_login(make_user())
    return client


def send(client: Client, scenario: str, thread_id: int | None = None, *, script: bool = False) -> Run:
    """The form posted as the page posts it (``script``: as chat.js does, asking for JSON); the run, ended."""
    url = reverse("demo:chat-thread", args=[thread_id]) if thread_id else reverse("demo:chat")
    headers: dict[str, Any] = {"accept": "application/json"} if script else {}
    response = client.post(
        url, {"prompt": "Tell me about harbours. [[words=120]]", "scenario": scenario}, headers=headers
    )
    assert response.status_code == (201 if script else 302)
    run = Run.objects.order_by("-created").first()
    assert run is not None
    wait_for(run.pk)
    run.refresh_from_db()
    return run


def thread_page(client: Client, run: Run) -> str:
    return client.get(reverse("demo:chat-thread", args=[run.thread_id])).content.decode()


def chosen_scenario(html: str) -> str:
    """The scenario the chooser shows: the option marked selected, else (as a browser does) the first."""
    (select,) = re.findall(r'<select id="sr-scenario".*?</select>', html, re.DOTALL)
    options = re.findall(r'<option value="([^"]+)"( selected)?>', select)
    chosen = [value for value, selected in options if selected]
    assert len(chosen) <= 1
    return chosen[0] if chosen else options[0][0]


@pytest.mark.parametrize(
    ("scenario", "status", "said"),
    [
        # what chat.js says live for each (tests/test_browser_chat.py pins the live wording)
        ("r1", "completed", "Recovered: the answer went on after the break."),
        ("r4", "completed", "Recovered: the answer started over after the break."),
        ("exhausted", "exhausted", "Gave up after 2 continuation attempts (continue_text)"),
    ],
)
def test_a_reloaded_page_says_how_the_answer_was_recovered_as_the_live_page_did(
    scenario: str, status: str, said: str
) -> None:
    """A whole restart (R4) and an exhausted run said nothing after a reload; R1's continuation did."""
    client = logged_in()
    run = send(client, scenario)
    assert run.status == status
    html = thread_page(client, run)
    assert shown(html, "sr-recovery") == [said]
    phase = "exhausted" if status == "exhausted" else "recovered"
    assert f'<span id="sr-recovery" class="sr-recovery" role="status" data-phase="{phase}">' in html  # not hidden


def test_an_answer_without_a_break_has_no_recovery_notice_after_a_reload() -> None:
    client = logged_in()
    run = send(client, "none")
    assert run.status == "completed"
    html = thread_page(client, run)
    assert shown(html, "sr-recovery") == [""]
    assert '<span id="sr-recovery" class="sr-recovery" role="status" hidden>' in html


@pytest.mark.parametrize("script", [False, True], ids=["without-javascript", "with-javascript"])
def test_the_chosen_fault_scenario_stays_chosen_after_a_reload_and_in_other_threads(script: bool) -> None:
    """Pick R1, send, reload: the chooser was back on "No fault" and the next message had no fault."""
    client = logged_in()
    assert chosen_scenario(client.get(reverse("demo:chat")).content.decode()) == "none"
    first = send(client, "r1", script=script)
    assert chosen_scenario(thread_page(client, first)) == "r1"  # the reload
    assert chosen_scenario(client.get(reverse("demo:chat")).content.decode()) == "r1"  # a new chat
    other = send(client, "r4", script=script)
    assert other.thread_id != first.thread_id
    assert chosen_scenario(thread_page(client, first)) == "r4"  # the other thread: the latest choice
    # sent again as the page now stands, the message gets the fault chosen
    again = send(client, chosen_scenario(thread_page(client, first)), first.thread_id)
    assert again.options.get("faults") == ["cut:events=8"]
