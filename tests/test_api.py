"""The JSON API (session auth, CSRF enforced), the chat page around it, its fault scenarios
and the demo user command."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

from project.demo.views import SCENARIOS
from streamrecover import starter
from streamrecover.models import Message, RecoveryEvent, Run, Thread

from .factories import make_attempt, make_run, make_thread, make_user

RUNS = "/streamrecover/api/runs/"


def logged_in(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def csrf_token(client: Client) -> str:
    """The token a page gives its scripts (the chat page renders one)."""
    assert client.get(reverse("demo:chat")).status_code == 200
    return client.cookies["csrftoken"].value


def post_json(client: Client, url: str, body: Any, **extra: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json", **extra)


def finish(run_id: Any, status: str = "completed") -> None:
    Run.objects.filter(pk=run_id).update(status=status)


@pytest.fixture
def user(db: Any) -> Any:
    return make_user()


# ---- POST api/runs/ -------------------------------------------------------------------------


def test_create_run_starts_a_thread_and_answers_where_to_watch(user: Any) -> None:
    client = logged_in(user, csrf=True)
    response = post_json(
        client,
        RUNS,
        {"prompt": "Hello [[words=5]]", "faults": ["cut:bytes=900"], "demo_tools": True},
        HTTP_X_CSRFTOKEN=csrf_token(client),
    )
    assert response.status_code == 201
    data = response.json()
    run = Run.objects.get(pk=data["run_id"])
    assert data == {
        "run_id": str(run.pk),
        "thread_id": run.thread_id,
        "status": "queued",
        "ws_url": f"/ws/streamrecover/runs/{run.pk}/",
    }
    assert run.owner == user
    assert run.thread.owner == user
    assert run.options["faults"] == ["cut:bytes=900"]
    assert run.options["demo_tools"] is True
    assert [m.as_canonical() for m in Message.objects.filter(thread=run.thread)] == [
        {"role": "user", "content": [{"type": "text", "text": "Hello [[words=5]]"}]}
    ]


def test_csrf_is_enforced_on_every_post(user: Any) -> None:
    client = logged_in(user, csrf=True)
    assert post_json(client, RUNS, {"prompt": "Hi"}).status_code == 403
    run = make_run(owner=user)
    assert client.post(reverse("streamrecover:api-run-cancel", args=[run.pk])).status_code == 403
    assert not Run.objects.filter(pk=run.pk, cancel_requested=True).exists()
    assert Run.objects.filter(owner=user).count() == 1


def test_a_follow_up_goes_into_the_users_thread(user: Any) -> None:
    client = logged_in(user)
    first = post_json(client, RUNS, {"prompt": "First"}).json()
    assert post_json(client, RUNS, {"prompt": "Second", "thread_id": first["thread_id"]}).status_code == 409
    finish(first["run_id"])
    second = post_json(client, RUNS, {"prompt": "Second", "thread_id": first["thread_id"]})
    assert second.status_code == 201
    assert second.json()["thread_id"] == first["thread_id"]
    assert list(Message.objects.filter(thread_id=first["thread_id"]).values_list("position", "role")) == [
        (0, "user"),
        (1, "user"),
    ]


def test_someone_elses_thread_is_not_found(user: Any) -> None:
    thread = make_thread(owner=make_user())
    response = post_json(logged_in(user), RUNS, {"prompt": "Hi", "thread_id": thread.pk})
    assert response.status_code == 404
    assert "thread" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        ("not json", "application/json", "not valid JSON"),
        ('["a list"]', "application/json", "JSON object"),
        ("prompt=Hi", "application/x-www-form-urlencoded", "application/json"),
        ("{}", "application/json", "'prompt' is required"),
        ('{"prompt": "   "}', "application/json", "'prompt' is required"),
        ('{"prompt": 42}', "application/json", "'prompt' is required"),
        ('{"prompt": "Hi", "provider": "nope"}', "application/json", "Unknown provider 'nope'"),
        ('{"prompt": "Hi", "provider": "anthropic"}', "application/json", "ANTHROPIC_API_KEY"),
        ('{"prompt": "Hi", "faults": "cut:bytes=9"}', "application/json", "list of fault strings"),
        ('{"prompt": "Hi", "faults": ["explode"]}', "application/json", "Bad fault 'explode'"),
        ('{"prompt": "Hi", "thread_id": "1"}', "application/json", "'thread_id' must be an integer"),
        ('{"prompt": "Hi", "thread_id": true}', "application/json", "'thread_id' must be an integer"),
        ('{"prompt": "Hi", "demo_tools": "yes"}', "application/json", "'demo_tools' must be true or false"),
        ('{"prompt": "Hi", "max_continuations": 99}', "application/json", "'max_continuations' must be between"),
        ('{"prompt": "Hi", "thinking_budget": 2048}', "application/json", "must be below 'max_tokens'"),
        ('{"prompt": "Hi", "thinking_budget": -5}', "application/json", "'thinking_budget' must be 0 or more"),
        ('{"prompt": "Hi", "max_tokens": 0}', "application/json", "'max_tokens' must be positive"),
    ],
)
def test_bad_input_is_a_400_with_a_clear_message(user: Any, body: str, content_type: str, message: str) -> None:
    response = logged_in(user).post(RUNS, data=body, content_type=content_type)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert not Run.objects.exists()


def test_faults_need_the_fake_provider(user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    body = {"prompt": "Hi", "provider": "anthropic", "faults": ["cut:bytes=10"]}
    response = post_json(logged_in(user), RUNS, body)
    assert response.status_code == 400
    assert "fake provider" in response.json()["error"]


def test_anonymous_callers_get_a_json_403(db: Any) -> None:
    client = Client()
    run = make_run()
    thread = make_thread()
    for response in (
        post_json(client, RUNS, {"prompt": "Hi"}),
        client.post(reverse("streamrecover:api-run-cancel", args=[run.pk])),
        client.get(reverse("streamrecover:api-run", args=[run.pk])),
        client.get(reverse("streamrecover:api-threads")),
        client.get(reverse("streamrecover:api-thread", args=[thread.pk])),
    ):
        assert response.status_code == 403
        assert response["Content-Type"] == "application/json"
        assert "log in" in response.json()["error"]


def test_wrong_methods_are_refused(user: Any) -> None:
    client = logged_in(user)
    run = make_run(owner=user)
    assert client.get(RUNS).status_code == 405
    assert client.get(reverse("streamrecover:api-run-cancel", args=[run.pk])).status_code == 405
    assert client.post(reverse("streamrecover:api-threads")).status_code == 405


# ---- runs --------------------------------------------------------------------------------------


def test_cancel_stops_a_queued_run_and_is_the_owners_or_a_change_permission_holders(user: Any) -> None:
    run = make_run(owner=user)
    other = logged_in(make_user())
    assert other.post(reverse("streamrecover:api-run-cancel", args=[run.pk])).status_code == 404
    client = logged_in(user, csrf=True)
    response = client.post(reverse("streamrecover:api-run-cancel", args=[run.pk]), HTTP_X_CSRFTOKEN=csrf_token(client))
    assert response.status_code == 202
    assert response.json() == {"run_id": str(run.pk), "cancel_requested": True, "status": "cancelled"}
    again = client.post(reverse("streamrecover:api-run-cancel", args=[run.pk]), HTTP_X_CSRFTOKEN=csrf_token(client))
    assert again.json()["cancel_requested"] is False
    staff_run = make_run(owner=user)
    assert (
        logged_in(make_user(is_staff=True))
        .post(reverse("streamrecover:api-run-cancel", args=[staff_run.pk]))
        .status_code
        == 404
    )
    operator = make_user(is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_run"))
    staff = logged_in(operator)
    assert staff.post(reverse("streamrecover:api-run-cancel", args=[staff_run.pk])).json()["cancel_requested"] is True


def test_run_detail_has_status_error_messages_and_attempts(user: Any) -> None:
    run = make_run(owner=user, status="failed", error_kind="exhausted", error_message="gave up")
    Message.objects.create(thread=run.thread, run=run, position=0, role="user", content=[{"type": "text", "text": "Q"}])
    Message.objects.create(
        thread=run.thread, run=run, position=1, role="assistant", content=[{"type": "text", "text": "A"}]
    )
    make_attempt(run, kind="initial", interrupt_cause="connection_reset", outcome="interrupted")
    make_attempt(run, kind="continuation", continuation=1, strategy="prefill", outcome="completed")
    data = logged_in(user).get(reverse("streamrecover:api-run", args=[run.pk])).json()
    assert data["status"] == "failed"
    assert data["error"] == {"kind": "exhausted", "message": "gave up"}
    assert [(m["position"], m["role"], m["content"][0]["text"]) for m in data["messages"]] == [
        (0, "user", "Q"),
        (1, "assistant", "A"),
    ]
    assert data["attempts"]["count"] == 2
    assert data["attempts"]["by_kind"] == {"initial": 1, "continuation": 1}
    assert data["attempts"]["interrupt_causes"] == ["connection_reset"]
    assert [a["strategy"] for a in data["attempts"]["items"]] == ["", "prefill"]
    assert data["ws_url"] == f"/ws/streamrecover/runs/{run.pk}/"
    assert logged_in(make_user()).get(reverse("streamrecover:api-run", args=[run.pk])).status_code == 404
    assert logged_in(make_user(is_staff=True)).get(reverse("streamrecover:api-run", args=[run.pk])).status_code == 404
    support = make_user(is_staff=True)
    support.user_permissions.add(Permission.objects.get(codename="view_run"))
    assert logged_in(support).get(reverse("streamrecover:api-run", args=[run.pk])).status_code == 200


# ---- threads -------------------------------------------------------------------------------------


def test_threads_list_and_detail_show_only_the_users_own(user: Any) -> None:
    mine = make_thread(owner=user, title="Mine")
    run = make_run(owner=user, thread=mine, status="completed")
    Message.objects.create(thread=mine, run=run, position=0, role="user", content=[{"type": "text", "text": "Q"}])
    make_thread(owner=make_user(), title="Theirs")
    client = logged_in(user)
    listing = client.get(reverse("streamrecover:api-threads")).json()
    assert [t["title"] for t in listing["threads"]] == ["Mine"]
    assert listing["threads"][0]["last_run"]["run_id"] == str(run.pk)
    detail = client.get(reverse("streamrecover:api-thread", args=[mine.pk])).json()
    assert detail["title"] == "Mine"
    assert detail["messages"] == [{"position": 0, "role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert [r["status"] for r in detail["runs"]] == ["completed"]
    theirs = Thread.objects.get(title="Theirs")
    assert client.get(reverse("streamrecover:api-thread", args=[theirs.pk])).status_code == 404


# ---- the chat page ---------------------------------------------------------------------------------


def test_the_chat_needs_a_login_and_shows_only_the_users_threads(user: Any) -> None:
    response = Client().get(reverse("demo:chat"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("demo:login"))
    mine = make_thread(owner=user, title="<b>mine</b>")
    run = make_run(owner=user, thread=mine)
    theirs = make_thread(owner=make_user(), title="theirs")
    client = logged_in(user)
    page = client.get(reverse("demo:chat-thread", args=[mine.pk]))
    html = page.content.decode()
    assert "&lt;b&gt;mine&lt;/b&gt;" in html
    assert "theirs" not in html
    config = page.context["config"]
    assert config["runId"] == str(run.pk)
    assert config["threadId"] == mine.pk
    assert [s["key"] for s in config["scenarios"]] == ["none", "r1", "r3", "r4", "overloaded", "exhausted"]
    assert client.get(reverse("demo:chat-thread", args=[theirs.pk])).status_code == 404


@override_settings(DEBUG=True)
def test_login_page_logs_in_and_goes_to_the_chat(user: Any) -> None:
    client = Client()
    page = client.get(reverse("demo:login"))
    assert b"Demo account" in page.content
    response = client.post(reverse("demo:login"), {"username": user.username, "password": "pw"})
    assert response.status_code == 302
    assert response["Location"] == reverse("demo:chat")


def test_the_demo_user_command_is_idempotent(db: Any) -> None:
    call_command("streamrecover_demo_user")
    call_command("streamrecover_demo_user")
    assert Client().login(username="demo", password="demo")


# ---- every fault scenario of the chat gives its recovery plan ----------------------------------------


def _scenario_body(key: str, prompt: str) -> dict[str, Any]:
    """The body chat.js posts for a scenario."""
    scenario = next(s for s in SCENARIOS if s.key == key)
    body: dict[str, Any] = {"prompt": prompt, "faults": list(scenario.faults)}
    if scenario.directives:
        body["system"] = scenario.directives
    body["demo_tools"] = scenario.demo_tools
    if scenario.max_tokens:
        body["max_tokens"] = scenario.max_tokens
    if scenario.thinking_budget:
        body["thinking_budget"] = scenario.thinking_budget
    if scenario.max_continuations is not None:
        body["max_continuations"] = scenario.max_continuations
    return body


def _wait_until_finished(run_id: str, timeout: float = 30) -> Run:
    """Until the run settled, its thread folded it into the analytics rollup and the thread ended
    (returning earlier races the thread's last writes against the test database's flush)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.is_terminal and run.analytics_folded:
            for thread in starter.run_threads(run_id):
                thread.join(max(0.0, deadline - time.monotonic()))
                assert not thread.is_alive(), f"run {run_id}'s thread still runs"
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("key", "status", "plans"),
    [
        ("none", "completed", []),
        ("r1", "completed", ["continue_text"]),
        ("r3", "completed", ["truncate_before_tool"]),
        ("r4", "completed", ["whole_restart"]),
        ("overloaded", "completed", ["continue_text"]),
        ("exhausted", "exhausted", ["continue_text", "continue_text", "continue_text"]),
    ],
)
@pytest.mark.parametrize("prompt", ["Tell me about lighthouses", "Hi"])
def test_each_chat_scenario_gives_its_plan(key: str, status: str, plans: list[str], prompt: str) -> None:
    client = logged_in(make_user())
    response = post_json(client, RUNS, _scenario_body(key, prompt))
    assert response.status_code == 201, response.content
    run = _wait_until_finished(response.json()["run_id"])  # executed in a thread (embedded mode)
    assert run.status == status, (run.error_kind, run.error_message)
    events = RecoveryEvent.objects.filter(run=run, name="llm_stream_interrupted").order_by("created", "id")
    assert [e.plan for e in events] == plans


@pytest.mark.django_db(transaction=True)
def test_a_scenario_steers_the_fake_without_writing_into_the_visitors_words() -> None:
    """The demo's R3 scenario needs the fake to answer with text and a tool call: its
    directives go as the run's system prompt, so the message is stored and shown as typed."""
    client = logged_in(make_user())
    typed = "What is the weather in Paris?"
    response = client.post(reverse("demo:chat"), {"prompt": typed, "scenario": "r3"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 201, response.content
    run = _wait_until_finished(response.json()["run_id"])
    assert run.status == "completed", (run.error_kind, run.error_message)
    user_messages = Message.objects.filter(thread=run.thread, role="user").order_by("position")
    assert user_messages[0].content == [{"type": "text", "text": typed}]
    assert run.thread.title == typed
    events = RecoveryEvent.objects.filter(run=run, name="llm_stream_interrupted")
    assert [e.plan for e in events] == ["truncate_before_tool"]
    answers = Message.objects.filter(thread=run.thread, role="assistant").order_by("position")
    first = answers[0].content
    assert first[0] == {"type": "text", "text": "Let me check the weather for you."}
    assert [b["name"] for b in first if b["type"] == "tool_use"] == ["get_weather"]


@pytest.mark.django_db
def test_a_system_prompt_must_be_a_string(db: Any) -> None:
    client = logged_in(make_user())
    response = post_json(client, RUNS, {"prompt": "Hi", "system": ["be brief"]})
    assert response.status_code == 400
    assert response.json()["error"] == "'system' must be a string."
    response = post_json(client, RUNS, {"prompt": "Hi", "system": "be\x00brief"})
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]
    assert not Run.objects.exists()
