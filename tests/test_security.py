"""Security, tried as an attacker would: someone else's run over every surface (WebSocket, JSON
API, chat page, admin) gives nothing away; a page on another origin gets no socket; every
state-changing request needs its CSRF token; model output is text on every page, never HTML.
(Secrets: tests/test_secrets_end_to_end.py and tests/test_stored_as_streamed.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator, OriginValidator
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse

from project.asgi import application, websocket_urlpatterns
from streamrecover.models import Message, Run

from .factories import make_attempt, make_event, make_message, make_run, make_user

PRIVATE_PROMPT = "ALICE-PRIVATE-PROMPT my medical history"
PRIVATE_ANSWER = "ALICE-PRIVATE-ANSWER take two pills"
XSS = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"><a href="javascript:alert(3)">x</a>'


def _alices_run() -> tuple[Any, Run]:
    alice = make_user(username="alice")
    run = make_run(owner=alice, status="running", error_message="")
    make_message(run.thread, role="user", content=[{"type": "text", "text": PRIVATE_PROMPT}], run=run)
    make_message(run.thread, role="assistant", content=[{"type": "text", "text": PRIVATE_ANSWER}], run=run)
    return alice, run


def _client(user: Any, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def _leaks(response: Any) -> bool:
    body = response.content.decode("utf-8", "replace")
    return PRIVATE_PROMPT in body or PRIVATE_ANSWER in body


# ---- someone else's run ------------------------------------------------------------------------


def _someone_else(who: str, *codenames: str) -> Any:
    """Bob, a plain user; or a staff account (what the admin asks permissions of) with these."""
    user = make_user(username="bob", is_staff=who != "user")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["user", "staff_without_permissions"])
def test_someone_elses_run_is_not_found_over_the_api_and_the_chat_page(who: str) -> None:
    _, run = _alices_run()
    client = _client(_someone_else(who))
    thread_id = run.thread_id
    responses = {
        "run detail": client.get(reverse("streamrecover:api-run", args=[run.pk])),
        "cancel": client.post(reverse("streamrecover:api-run-cancel", args=[run.pk])),
        "thread detail": client.get(reverse("streamrecover:api-thread", args=[thread_id])),
        "follow-up": client.post(
            reverse("streamrecover:api-runs"),
            data=json.dumps({"prompt": "Tell me hers", "thread_id": thread_id}),
            content_type="application/json",
        ),
        "chat thread": client.get(reverse("demo:chat-thread", args=[thread_id])),
        "chat post": client.post(reverse("demo:chat-thread", args=[thread_id]), {"prompt": "Tell me hers"}),
    }
    for name, response in responses.items():
        assert response.status_code == 404, name
        assert not _leaks(response), name
    listing = client.get(reverse("streamrecover:api-threads"))
    assert listing.status_code == 200
    assert listing.json()["threads"] == []
    chat = client.get(reverse("demo:chat"))
    assert not _leaks(chat)
    # nothing was changed: no cancel, no message, no run in her thread
    run.refresh_from_db()
    assert not run.cancel_requested
    assert Message.objects.filter(thread_id=thread_id).count() == 2
    assert Run.objects.filter(thread_id=thread_id).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["anonymous", "user", "staff_without_permissions"])
def test_someone_elses_run_is_not_shown_in_the_admin(who: str) -> None:
    _, run = _alices_run()
    attempt = make_attempt(run, request={"json": {"messages": [{"role": "user", "content": PRIVATE_PROMPT}]}})
    client = Client() if who == "anonymous" else _client(make_user(username="mallory", is_staff=who != "user"))
    pages = [
        reverse("admin:streamrecover_run_changelist"),
        reverse("admin:streamrecover_run_change", args=[run.pk]),
        reverse("admin:streamrecover_thread_change", args=[run.thread_id]),
        reverse("admin:streamrecover_message_changelist"),
        reverse("admin:streamrecover_attempt_change", args=[attempt.pk]),
    ]
    for page in pages:
        response = client.get(page)
        assert response.status_code in (302, 403), (page, response.status_code)
        if response.status_code == 302:
            assert response["Location"].startswith(reverse("admin:login")), page
        assert not _leaks(response), page


@pytest.mark.django_db
def test_staff_with_view_permission_sees_the_run_in_the_admin() -> None:
    """The same pages do show it to whom they are for (the test above can fail)."""
    _, run = _alices_run()
    staff = make_user(username="support", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "view_message", "view_thread"]))
    response = _client(staff).get(reverse("admin:streamrecover_run_change", args=[run.pk]))
    assert response.status_code == 200
    assert _leaks(response)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who", ["user", "staff_without_permissions"])
async def test_someone_elses_run_over_the_websocket_gets_no_frame_of_it(who: str) -> None:
    _, run = await sync_to_async(_alices_run)()
    bob = await sync_to_async(_someone_else)(who)
    cookie = await sync_to_async(lambda: _client(bob).cookies["sessionid"].value)()
    for after in ("", "?after=0", "?after=1"):
        ws = WebsocketCommunicator(
            application,
            f"/ws/streamrecover/runs/{run.pk}/{after}",
            headers=[(b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())],
        )
        connected, _ = await ws.connect(timeout=10)
        assert connected
        error = await ws.receive_json_from(timeout=10)
        assert error["type"] == "error"
        assert error["code"] == "forbidden"
        assert PRIVATE_PROMPT not in json.dumps(error)
        await ws.send_json_to({"type": "cancel"})  # too late: the socket is closed
        assert await ws.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}
        await ws.disconnect()
    await run.arefresh_from_db()
    assert not run.cancel_requested


@pytest.mark.django_db
def test_staff_with_the_view_permission_reads_it_over_the_api_but_cancels_only_with_the_change_permission() -> None:
    """The admin's rule on every surface: view_run reads the run and its thread; cancelling
    needs change_run, as the admin's cancel action does (the tests above can fail)."""
    _, run = _alices_run()
    support = _client(_someone_else("staff", "view_run"))
    detail = support.get(reverse("streamrecover:api-run", args=[run.pk]))
    thread = support.get(reverse("streamrecover:api-thread", args=[run.thread_id]))
    assert (detail.status_code, thread.status_code) == (200, 200)
    assert _leaks(detail)
    assert _leaks(thread)
    refused = support.post(reverse("streamrecover:api-run-cancel", args=[run.pk]))
    assert refused.status_code == 403
    assert "permission" in refused.json()["error"]
    run.refresh_from_db()
    assert not run.cancel_requested
    # their thread stays theirs: no follow-up in it, and it is not in the caller's list
    follow_up = support.post(
        reverse("streamrecover:api-runs"),
        data=json.dumps({"prompt": "Tell me hers", "thread_id": run.thread_id}),
        content_type="application/json",
    )
    assert follow_up.status_code == 404
    assert support.get(reverse("streamrecover:api-threads")).json()["threads"] == []
    operator = make_user(username="operator", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_run"))
    cancelled = _client(operator).post(reverse("streamrecover:api-run-cancel", args=[run.pk]))
    assert cancelled.status_code == 202
    run.refresh_from_db()
    assert run.cancel_requested


@pytest.mark.django_db(transaction=True)
async def test_staff_with_the_view_permission_watches_it_over_the_websocket_but_cannot_cancel_it() -> None:
    _, run = await sync_to_async(_alices_run)()
    support = await sync_to_async(_someone_else)("staff", "view_run")
    cookie = await sync_to_async(lambda: _client(support).cookies["sessionid"].value)()
    ws = WebsocketCommunicator(
        application,
        f"/ws/streamrecover/runs/{run.pk}/",
        headers=[(b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())],
    )
    connected, _ = await ws.connect(timeout=10)
    assert connected
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot"
    assert PRIVATE_ANSWER in json.dumps(snapshot)
    await ws.send_json_to({"type": "cancel"})
    refused = await ws.receive_json_from(timeout=10)
    assert (refused["type"], refused["code"]) == ("error", "forbidden")
    await ws.send_json_to({"type": "resync"})  # still watching: the socket stays open
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    await ws.disconnect()
    await run.arefresh_from_db()
    assert not run.cancel_requested


# ---- another origin --------------------------------------------------------------------------


def _origin_checked_app() -> Any:
    """The project's WebSocket stack (origin check around the auth stack), built for a site
    whose ALLOWED_HOSTS is ``testserver`` (the test settings allow any host)."""
    websocket = application.application_mapping["websocket"]
    assert isinstance(websocket, OriginValidator)  # the project's own application has the check
    with override_settings(ALLOWED_HOSTS=["testserver"]):
        return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


@pytest.mark.django_db(transaction=True)
async def test_a_page_on_another_origin_gets_no_socket_even_with_the_users_cookie() -> None:
    alice, run = await sync_to_async(_alices_run)()
    checked = _origin_checked_app()
    cookie = await sync_to_async(lambda: _client(alice).cookies["sessionid"].value)()
    path = f"/ws/streamrecover/runs/{run.pk}/"
    for origin in (
        b"https://evil.example",
        b"null",
        b"http://testserver.evil.example",
        b"http://evil.example:80",
        None,
    ):
        headers = [(b"cookie", f"sessionid={cookie}".encode())]
        if origin is not None:
            headers.append((b"origin", origin))
        ws = WebsocketCommunicator(checked, path, headers=headers)
        connected, _ = await ws.connect(timeout=10)
        assert not connected, origin
        await ws.disconnect()
    # the same cookie from the site's own origin does get the run (so the refusals above can fail)
    ws = WebsocketCommunicator(
        checked, path, headers=[(b"origin", b"http://testserver"), (b"cookie", f"sessionid={cookie}".encode())]
    )
    connected, _ = await ws.connect(timeout=10)
    assert connected
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot"
    assert PRIVATE_ANSWER in json.dumps(snapshot)
    await ws.disconnect()


# ---- CSRF ----------------------------------------------------------------------------------------


def _post_refused_then_accepted(user: Any, url: str, data: dict[str, Any]) -> None:
    """Without its CSRF token the post is refused; with it, the same post is accepted."""
    client = _client(user, enforce_csrf_checks=True)
    assert client.post(url, data).status_code == 403, url
    client.get(reverse("demo:chat"))  # a page that gives the token
    token = client.cookies["csrftoken"].value
    assert client.post(url, {**data, "csrfmiddlewaretoken": token}).status_code in (200, 302), url


@pytest.mark.django_db
def test_every_state_changing_post_of_the_chat_page_and_the_admin_needs_its_csrf_token(monkeypatch) -> None:
    monkeypatch.setattr("streamrecover.dispatch.enqueue_run", lambda run: None)  # start nothing
    alice, run = _alices_run()
    Run.objects.filter(pk=run.pk).update(status="completed")
    runs, messages = Run.objects.count(), Message.objects.count()
    _post_refused_then_accepted(alice, reverse("demo:chat"), {"prompt": "A new thread"})
    assert (Run.objects.count(), Message.objects.count()) == (runs + 1, messages + 1)
    _post_refused_then_accepted(alice, reverse("demo:chat-thread", args=[run.thread_id]), {"prompt": "A follow-up"})
    assert Message.objects.filter(thread_id=run.thread_id).count() == 3

    superuser = make_user(username="root", is_staff=True, is_superuser=True)
    changelist = reverse("admin:streamrecover_run_changelist")
    running = make_run(owner=alice, status="running")
    _post_refused_then_accepted(
        superuser, changelist, {"action": "cancel_running_runs", "_selected_action": [running.pk]}
    )
    running.refresh_from_db()
    assert running.cancel_requested
    failed = make_run(owner=alice, status="failed")
    _post_refused_then_accepted(
        superuser, changelist, {"action": "requeue_failed_runs", "_selected_action": [failed.pk]}
    )
    failed.refresh_from_db()
    assert failed.status == "queued"


# ---- model output is text, never HTML --------------------------------------------------------------


@pytest.mark.django_db
def test_model_output_is_escaped_on_the_chat_page_and_in_the_admin() -> None:
    alice = make_user(username="alice")
    run = make_run(owner=alice, status="failed", error_message=f"provider said {XSS}")
    make_message(run.thread, role="user", content=[{"type": "text", "text": "Show me HTML"}], run=run)
    make_message(
        run.thread,
        role="assistant",
        content=[
            {"type": "thinking", "thinking": XSS, "signature": "sig"},
            {"type": "text", "text": XSS},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": XSS}},
        ],
        run=run,
    )
    make_event(run, payload={"error_message": XSS})
    superuser = make_user(username="root", is_staff=True, is_superuser=True)
    pages = [
        (alice, reverse("demo:chat-thread", args=[run.thread_id])),
        (superuser, reverse("admin:streamrecover_run_change", args=[run.pk])),
        (superuser, reverse("admin:streamrecover_thread_change", args=[run.thread_id])),
        (superuser, reverse("admin:streamrecover_message_changelist")),
        (superuser, reverse("admin:streamrecover_run_changelist")),
    ]
    for user, url in pages:
        response = _client(user).get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for raw in ("<script>window.__pwned", "<img src=x", 'href="javascript:'):
            assert raw not in html, (url, raw)
    chat = _client(alice).get(reverse("demo:chat-thread", args=[run.thread_id])).content.decode()
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in chat  # shown as text, not dropped
    api = _client(alice).get(reverse("streamrecover:api-thread", args=[run.thread_id]))
    assert api["content-type"] == "application/json"
    assert api.json()["messages"][1]["content"][1]["text"] == XSS  # stored and served as written
