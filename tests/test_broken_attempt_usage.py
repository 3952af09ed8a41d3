"""A broken attempt is billed, yet its provider's final usage never arrives: the stored attempt
carries the engine's estimate (flagged ``usage_estimated``), never less than the fake's bill, and
analytics' ``output_tokens_billed`` counts it. Real HTTP against the fake provider, whose log is the bill."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.test import override_settings

from streamrecover import starter
from streamrecover.analytics.report import build_report
from streamrecover.analytics.windows import Window
from streamrecover.engine.estimate import estimated_usage
from streamrecover.engine.events import Usage
from streamrecover.models import Attempt
from streamrecover.runs import lifecycle

from .harness import run

STORY = "A story [[words=200]]"
CUT = "cut:events=60"
WIRES = [("anthropic", "claude-3-7-sonnet"), ("openai", "gpt-4o"), ("openai-responses", "gpt-4o")]


@pytest.mark.parametrize(("wire", "model"), WIRES)
async def test_stored_usage_covers_what_the_provider_billed(fake_server, wire, model) -> None:
    out = await run(fake_server, STORY, wire=wire, model=model, faults=[CUT])
    assert out.status == "completed"
    billed = [e.billed_output_tokens for e in out.log]
    stored = [a.usage.output_tokens or 0 for a in out.sink.attempts]
    assert sum(stored) >= sum(billed), (stored, billed)
    broken, finished = out.sink.attempts
    assert broken.outcome == "interrupted"
    assert broken.usage_estimated
    assert broken.usage.output_tokens is not None
    assert broken.usage.output_tokens >= billed[0]
    assert broken.usage.input_tokens  # the broken request's input was billed too
    # the attempt whose final usage arrived keeps the provider's own count, unflagged
    assert finished.outcome == "completed"
    assert not finished.usage_estimated
    assert finished.usage.output_tokens == billed[1]


@pytest.mark.django_db(transaction=True)
def test_analytics_counts_what_a_broken_attempt_was_billed(fake_server, settings) -> None:
    scenario = "estimate-openai"
    fake_server.set_faults(scenario, [CUT])
    providers = {
        "fake": {
            "ADAPTER": "openai",
            "BASE_URL": f"{fake_server.base_url}/v1",
            "API_KEY": "sk-test-estimate",
            "EXTRA_HEADERS": {"x-fake-scenario": scenario},
        }
    }
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROVIDERS": providers}):
        created = lifecycle.create_run(prompt=STORY, provider="fake", model="gpt-4o")
        result = asyncio.run(starter.execute_here(str(created.pk)))
    assert result is not None
    assert result.status == "completed"
    billed = sum(e.billed_output_tokens for e in fake_server.log_for(scenario))
    totals = build_report(Window.last(timedelta(hours=1)), rollup=False)["totals"]
    assert totals["output_tokens_billed"] >= billed
    broken = Attempt.objects.get(run=created, outcome="interrupted")
    finished = Attempt.objects.get(run=created, outcome="completed")
    assert broken.usage_estimated
    assert broken.output_tokens
    assert broken.input_tokens
    assert not finished.usage_estimated
    assert totals["output_tokens_billed"] == broken.output_tokens + (finished.output_tokens or 0)
    assert totals["continuation_input_tokens"] == finished.input_tokens


def test_the_input_estimate_counts_the_text_not_an_images_base64() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 100_000}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "héllo"}, image]}]}
    usage = estimated_usage(Usage(), 7, body)
    # every string but the image's data: a bound on the text's tokens, not 100,000 of them
    strings = ("m", "user", "text", "héllo", "image", "base64", "image/png")
    assert usage.input_tokens == sum(len(t.encode()) for t in strings)
    assert usage.output_tokens == 7
    assert estimated_usage(Usage(input_tokens=40, output_tokens=9), 7, body) == Usage(input_tokens=40, output_tokens=9)


async def test_a_response_gone_before_its_re_attach_keeps_the_broken_attempts_estimate(fake_server) -> None:
    # The estimate waited for the re-attached end, which reports the whole response; the
    # response was gone (404), so nothing came and the billed broken part was stored as nothing.
    out = await run(
        fake_server,
        STORY,
        wire="openai-responses",
        model="gpt-4o",
        faults=[CUT, "status:404"],
        provider_kw={"native_resume": True},
    )
    assert out.status == "completed", out.result.error
    broken = out.sink.attempts[0]
    assert (broken.outcome, broken.usage_estimated) == ("interrupted", True)
    # what streamed before the cut; the background response went on generating server-side
    # after it, which no count reports (docs/analytics.md)
    assert broken.usage.output_tokens
    assert broken.usage.input_tokens


async def test_a_re_attached_response_is_counted_once(fake_server) -> None:
    # the re-attached end reports the whole response's usage: the broken part's estimate is withdrawn
    out = await run(
        fake_server, STORY, wire="openai-responses", model="gpt-4o", faults=[CUT], provider_kw={"native_resume": True}
    )
    assert out.status == "completed", out.result.error
    broken, resumed = out.sink.attempts
    assert resumed.kind == "native_resume"
    assert not broken.usage_estimated
    assert not broken.usage.output_tokens
    assert resumed.usage.output_tokens == sum(e.billed_output_tokens for e in out.log)
