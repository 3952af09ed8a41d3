"""The admin: every model browsable and read-only, filters, search, inlines, the actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from streamrecover import models
from streamrecover.analytics import rollup
from streamrecover.models import Attempt, Message, RecoveryEvent, Run, StreamCheckpoint, Thread

from .factories import make_attempt, make_event, make_message, make_run, make_thread, make_user
from .test_analytics import History, record_history

pytestmark = pytest.mark.django_db

BROWSABLE = (
    models.Run,
    models.FailedRun,
    models.ExhaustedRun,
    models.RecoveredRun,
    models.Attempt,
    models.RecoveryEvent,
    models.Message,
    models.Thread,
    models.StreamCheckpoint,
    models.AnalyticsRollup,
)


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def history() -> History:
    recorded = record_history()
    rollup.fold_all()  # rollup rows to browse
    return recorded


def _url(model: type, view: str, *args: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _changelist_ids(response: Any) -> set[str]:
    return {str(obj.pk) for obj in response.context["cl"].result_list}


def _checkpoint(run: Run) -> StreamCheckpoint:
    from django.utils import timezone

    return StreamCheckpoint.objects.create(
        run=run, data={"blocks": [{"type": "text", "text": "Partial <b>answ"}]}, updated_at=timezone.now()
    )


def test_every_model_is_registered() -> None:
    for model in (*BROWSABLE, models.RecoveryAnalytics):
        assert admin.site.is_registered(model), model


def test_every_changelist_and_change_page_renders(superuser_client: Client, history: History) -> None:
    run = history.runs["r1"]
    make_message(run.thread, run=run, role="assistant", content=[{"type": "text", "text": "Hi"}])
    _checkpoint(history.runs["cancelled"])
    for model in BROWSABLE:
        response = superuser_client.get(_url(model, "changelist"))
        assert response.status_code == 200, model
        obj = model._default_manager.first()
        assert obj is not None, model
        response = superuser_client.get(_url(model, "change", obj.pk))
        assert response.status_code == 200, model


@pytest.mark.parametrize("model", BROWSABLE)
def test_read_only(superuser_client: Client, model: type) -> None:
    for status in ("failed", "exhausted", "completed"):
        run = make_run(status=status)
        make_attempt(run)
        make_event(run, "llm_stream_interrupted")
        make_event(run, "llm_stream_continuation_completed")
        make_message(run.thread, run=run)
        _checkpoint(run)
    rollup.fold_all()
    obj = model._default_manager.first()
    assert obj is not None
    model_admin = admin.site._registry[model]
    request = superuser_client.get(_url(model, "changelist")).wsgi_request
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, obj)
    assert not model_admin.has_delete_permission(request, obj)
    assert "delete_selected" not in model_admin.get_actions(request)
    assert superuser_client.get(_url(model, "add")).status_code == 403
    assert superuser_client.post(_url(model, "add"), {}).status_code == 403
    assert superuser_client.get(_url(model, "delete", obj.pk)).status_code == 403
    assert superuser_client.post(_url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    response = superuser_client.post(_url(model, "change", obj.pk), {"status": "completed", "name": "x"})
    assert response.status_code == 403
    assert model._default_manager.filter(pk=obj.pk).exists()


def test_nothing_was_changed_by_the_refused_posts(superuser_client: Client) -> None:
    run = make_run(status="failed", provider="fake")
    superuser_client.post(_url(Run, "change", run.pk), {"status": "completed", "provider": "other"})
    run.refresh_from_db()
    assert (run.status, run.provider) == ("failed", "fake")


def test_run_page_shows_messages_attempts_and_events_in_order(superuser_client: Client, history: History) -> None:
    run = history.runs["r1_twice"]
    make_message(run.thread, run=run, role="user", position=0, content=[{"type": "text", "text": "Tell me <b>all</b>"}])
    make_message(run.thread, run=run, role="assistant", position=1, content=[{"type": "text", "text": "Answer"}])
    response = superuser_client.get(_url(Run, "change", run.pk))
    html = response.content.decode()
    formsets = {f.opts.model for f in response.context["inline_admin_formsets"]}
    assert formsets == {Message, Attempt, RecoveryEvent}
    # events, in the order they happened
    names = [f.original.name.removeprefix("llm_stream_") for f in next(iter(_inline(response, RecoveryEvent)))]
    assert names == [
        "interrupted",
        "continuation_started",
        "interrupted",
        "continuation_started",
        "continuation_completed",
    ]
    assert html.index("idle_stall") < html.index("continuation_completed")
    # attempts by index, messages by position
    attempts = [f.original.index for f in next(iter(_inline(response, Attempt)))]
    assert attempts == [0, 1, 2]
    positions = [f.original.position for f in next(iter(_inline(response, Message)))]
    assert positions == [0, 1]
    # JSON pretty-printed and escaped
    assert '<pre class="sr-json"' in html
    assert "&quot;kept_output_tokens_estimate&quot;: 20" in html
    assert "Tell me &lt;b&gt;all&lt;/b&gt;" in html
    assert "Tell me <b>all</b>" not in html
    # nothing on the page can be edited
    assert 'name="_save"' not in html
    assert "<textarea" not in html


def _inline(response: Any, model: type) -> list[Any]:
    return [f for f in response.context["inline_admin_formsets"] if f.opts.model is model]


def test_event_payload_is_escaped_on_its_own_page(superuser_client: Client) -> None:
    run = make_run()
    event = make_event(run, payload={"error_message": "<script>alert(1)</script>", "cause": "goaway"})
    html = superuser_client.get(_url(RecoveryEvent, "change", event.pk)).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<pre class="sr-json"' in html


def test_run_filters(superuser_client: Client, history: History) -> None:
    runs = history.runs
    url = _url(Run, "changelist")

    def ids(**params: str) -> set[str]:
        response = superuser_client.get(url, params)
        assert response.status_code == 200
        return _changelist_ids(response)

    assert ids(status="exhausted") == {str(runs["exhausted"].pk)}
    assert ids(provider="openai") == {str(runs[k].pk) for k in ("r3", "r4", "failed")}
    assert ids(model="gpt-x") == ids(provider="openai")
    assert ids(cause="idle_stall") == {str(runs["r1_twice"].pk), str(runs["r4"].pk)}
    assert ids(plan="whole_restart") == {str(runs["r4"].pk)}
    assert ids(plan="synthesize_tool_use") == {str(runs["r2"].pk)}
    day = runs["outside"].created.replace(hour=0, minute=0, second=0, microsecond=0)
    assert ids(created__gte=day.isoformat(), created__lt=(day + timedelta(days=1)).isoformat()) == {
        str(runs["outside"].pk)
    }
    response = superuser_client.get(url)
    filters = {spec.title for spec in response.context["cl"].filter_specs}
    assert {"status", "provider", "model", "interrupt cause", "recovery plan", "created"} <= filters


def test_event_and_attempt_filters(superuser_client: Client, history: History) -> None:
    response = superuser_client.get(_url(RecoveryEvent, "changelist"), {"name": "discarded_partial_tool_use"})
    assert {e.run_id for e in response.context["cl"].result_list} == {history.runs["r2"].pk, history.runs["r3"].pk}
    response = superuser_client.get(_url(RecoveryEvent, "changelist"), {"cause": "sse_parse"})
    assert [e.run_id for e in response.context["cl"].result_list] == [history.runs["thinking"].pk]
    response = superuser_client.get(_url(RecoveryEvent, "changelist"), {"plan": "truncate_before_tool"})
    names = {e.name for e in response.context["cl"].result_list}
    assert names == {"llm_stream_interrupted", "llm_stream_continuation_started"}
    response = superuser_client.get(_url(Attempt, "changelist"), {"kind": "resume"})
    assert [a.run_id for a in response.context["cl"].result_list] == [history.runs["resumed"].pk]
    response = superuser_client.get(_url(Attempt, "changelist"), {"run__provider": "openai", "outcome": "completed"})
    assert len(response.context["cl"].result_list) == 2


def test_the_event_name_filter_offers_every_event_the_engine_records(superuser_client: Client) -> None:
    from streamrecover.engine import sink

    recorded = {
        value
        for name, value in vars(sink).items()
        if name.isupper() and isinstance(value, str) and value.startswith(("llm_", "discarded_"))
    }
    response = superuser_client.get(_url(RecoveryEvent, "changelist"))
    (name_filter,) = [
        spec for spec in response.context["cl"].filter_specs if getattr(spec, "parameter_name", "") == "name"
    ]
    offered = {value for value, _label in name_filter.lookup_choices}
    assert {"llm_stream_failover", "llm_response_abandoned"} <= recorded
    assert offered == recorded


def test_search_by_run_id_and_provider_request_id(superuser_client: Client) -> None:
    run = make_run()
    make_attempt(run, provider_request_id="req_011CabcXYZ")
    other = make_run()
    make_attempt(other, provider_request_id="req_other")
    make_event(run)
    make_event(other)

    def search(model: type, term: str) -> set[str]:
        response = superuser_client.get(_url(model, "changelist"), {"q": term})
        assert response.status_code == 200
        return _changelist_ids(response)

    assert search(Run, str(run.pk)) == {str(run.pk)}
    assert search(Run, "req_011CabcXYZ") == {str(run.pk)}
    assert search(Run, "not-a-uuid") == set()
    assert {e.run_id for e in RecoveryEvent.objects.filter(pk__in=search(RecoveryEvent, str(run.pk)))} == {run.pk}
    assert {e.run_id for e in RecoveryEvent.objects.filter(pk__in=search(RecoveryEvent, "req_other"))} == {other.pk}
    assert {a.run_id for a in Attempt.objects.filter(pk__in=search(Attempt, "req_011CabcXYZ"))} == {run.pk}
    assert {a.run_id for a in Attempt.objects.filter(pk__in=search(Attempt, str(other.pk)))} == {other.pk}


def test_proxy_lists(superuser_client: Client, history: History) -> None:
    runs = history.runs

    def listed(model: type) -> set[str]:
        return _changelist_ids(superuser_client.get(_url(model, "changelist")))

    assert listed(models.FailedRun) == {str(runs["failed"].pk), str(runs["failed_prestream"].pk)}
    assert listed(models.ExhaustedRun) == {str(runs["exhausted"].pk)}
    recovered = {"r1", "r1_twice", "r2", "r3", "r4", "thinking", "outside", "two_turns", "resumed"}
    assert listed(models.RecoveredRun) == {str(runs[k].pk) for k in recovered}
    # the inlines work on a proxy's page too
    response = superuser_client.get(_url(models.ExhaustedRun, "change", runs["exhausted"].pk))
    assert response.status_code == 200
    assert "llm_stream_continuation_exhausted" in response.content.decode()


def test_admin_index_links_to_the_analytics_page(superuser_client: Client) -> None:
    html = superuser_client.get(reverse("admin:index")).content.decode()
    link = _url(models.RecoveryAnalytics, "changelist")
    assert link in html
    assert "Recovery analytics" in html
    response = superuser_client.get(link)
    assert response.status_code == 302
    assert response["Location"] == reverse("streamrecover_analytics:page") == "/streamrecover/analytics/"
    app_html = superuser_client.get(reverse("admin:app_list", args=["streamrecover"])).content.decode()
    assert link in app_html


def test_staff_without_permissions_sees_the_analytics_link_only() -> None:
    client = Client()
    client.force_login(make_user(is_staff=True))
    html = client.get(reverse("admin:index")).content.decode()
    assert _url(models.RecoveryAnalytics, "changelist") in html
    assert _url(Run, "changelist") not in html
    assert client.get(_url(Run, "changelist")).status_code == 403


# ---- actions --------------------------------------------------------------------------------------


def _act(client: Client, action: str, runs: list[Run], model: type = Run) -> Any:
    return client.post(
        _url(model, "changelist"),
        {"action": action, "_selected_action": [str(r.pk) for r in runs], "index": "0"},
        follow=True,
    )


def test_requeue_failed_runs(superuser_client: Client) -> None:
    failed = make_run(status="failed", error_kind="overloaded", claims=3)
    exhausted = make_run(status="exhausted")
    completed = make_run(status="completed")
    running = make_run(status="running")
    response = _act(superuser_client, "requeue_failed_runs", [failed, exhausted, completed, running])
    assert response.status_code == 200
    for run in (failed, exhausted, completed, running):
        run.refresh_from_db()
    assert (failed.status, failed.claims, failed.error_kind) == ("queued", 0, "")
    assert exhausted.status == "queued"
    assert completed.status == "completed"
    assert running.status == "running"  # a live run is never re-queued from here
    text = [str(m) for m in response.context["messages"]]
    assert text == ["Re-queued 2 runs. 2 skipped (not in a state that allows it)."]


def test_cancel_running_runs(superuser_client: Client) -> None:
    running = make_run(status="running")
    queued = make_run(status="queued")
    completed = make_run(status="completed")
    response = _act(superuser_client, "cancel_running_runs", [running, queued, completed])
    for run in (running, queued, completed):
        run.refresh_from_db()
    assert running.cancel_requested
    assert running.cancel_reason.startswith("cancelled in the admin by ")
    assert running.status == "running"  # the worker stops it within a tick
    assert (queued.status, queued.cancel_requested) == ("cancelled", True)
    assert (completed.status, completed.cancel_requested) == ("completed", False)
    assert [str(m) for m in response.context["messages"]] == [
        "Cancel requested for 2 runs. 1 skipped (not in a state that allows it)."
    ]


def test_actions_from_a_proxy_list(superuser_client: Client) -> None:
    failed = make_run(status="failed")
    _act(superuser_client, "requeue_failed_runs", [failed], model=models.FailedRun)
    failed.refresh_from_db()
    assert failed.status == "queued"


def test_actions_need_the_change_permission() -> None:
    viewer = make_user(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(viewer)
    failed = make_run(status="failed")
    request = client.get(_url(Run, "changelist")).wsgi_request
    assert set(admin.site._registry[Run].get_actions(request)) == set()
    _act(client, "requeue_failed_runs", [failed])
    failed.refresh_from_db()
    assert failed.status == "failed"
    operator = make_user(is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "change_run"]))
    client.force_login(operator)
    request = client.get(_url(Run, "changelist")).wsgi_request
    assert set(admin.site._registry[Run].get_actions(request)) == {"requeue_failed_runs", "cancel_running_runs"}
    _act(client, "requeue_failed_runs", [failed])
    failed.refresh_from_db()
    assert failed.status == "queued"


def test_thread_page_shows_its_messages(superuser_client: Client) -> None:
    thread = make_thread(title="About <i>streams</i>")
    make_message(thread, content=[{"type": "text", "text": "first"}])
    make_message(thread, role="assistant", content=[{"type": "text", "text": "second"}])
    html = superuser_client.get(_url(Thread, "change", thread.pk)).content.decode()
    assert html.index("first") < html.index("second")
    assert "About &lt;i&gt;streams&lt;/i&gt;" in html


def test_run_list_shows_a_short_id_with_the_whole_id_on_hover_and_in_the_link(superuser_client: Client) -> None:
    import re

    run = make_run(model="claude-sonnet-4-5-20250929")
    html = superuser_client.get(_url(Run, "changelist")).content.decode()
    row = re.search(r'<tr>\s*<td class="action-checkbox">.*?</tr>', html, re.S)
    assert row is not None
    cells = row.group(0)
    full, short = str(run.pk), str(run.pk)[:8]
    link = _url(Run, "change", run.pk)
    assert f'<a href="{link}"><code title="{full}" style="white-space: nowrap">{short}…</code><br><small>' in cells
    visible = re.sub(r"<[^>]*>", " ", cells)
    assert full not in visible  # the whole UUID is no longer text that wraps
    assert short in visible
    # The column sorts by when the run was created (shown under its id).
    assert superuser_client.get(_url(Run, "changelist"), {"o": "1"}).status_code == 200
