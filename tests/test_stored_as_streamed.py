"""Stored == streamed: model output and user prompts that merely look like secrets ("bearer
bonds", a placeholder ``sk-`` key) are stored byte for byte, in messages, checkpoints and the
stored request, and a resume from a real checkpoint store continues the unaltered prefix.
Only the app's own configured API key is cut out of what is stored (docs/recovery.md)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.test import Client, override_settings

from streamrecover import starter
from streamrecover.engine.checkpoint import Checkpoint
from streamrecover.live.snapshot import RunRecord, build_snapshot
from streamrecover.models import Attempt, Message, Run, StreamCheckpoint
from streamrecover.runs import lifecycle
from streamrecover.runs.checkpoints import DjangoCheckpointStore, RedisCheckpointStore

from .factories import make_user
from .harness import run as engine_run

pytestmark = pytest.mark.django_db(transaction=True)

LOOKALIKE = (
    "The bearer bonds of 1900 paid whoever held them. A request carries "
    "Authorization: Bearer abcdefghijklmnopqrstuvwx and a placeholder key such as "
    "sk-abcdefghijklmnopqrstuvwxyz goes in the config file. " + " ".join(f"word{i}" for i in range(60))
)
PROMPT = f"Explain bearer bonds. Bearer abcdefghijklmnopqrstuvwx sk-abcdefghijklmnopqrstuvwxyz [[text={LOOKALIKE}]]"
APP_KEY = "sk-ant-api03-THE-APPS-OWN-KEY-0123456789"


def providers(fake_server, scenario: str) -> dict:
    return {
        "fake": {
            "ADAPTER": "anthropic",
            "BASE_URL": fake_server.base_url,
            "API_KEY": APP_KEY,
            "EXTRA_HEADERS": {"x-fake-scenario": scenario},
        }
    }


def texts(message: Message | dict) -> str:
    content = message.content if isinstance(message, Message) else message["content"]
    return "".join(block.get("text", "") for block in content)


def test_lookalike_output_and_prompt_are_stored_as_streamed(fake_server, settings):
    fake_server.set_faults("lookalike", ["cut:bytes=900"])  # recovered in process: a join too
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROVIDERS": providers(fake_server, "lookalike")}):
        owner = make_user()
        run = lifecycle.create_run(prompt=PROMPT, owner=owner, provider="fake", model="claude-3")
        result = asyncio.run(starter.execute_here(str(run.pk)))
        assert result is not None
        assert result.status == "completed"

        user, assistant = Message.objects.filter(thread_id=run.thread_id).order_by("position")
        assert texts(user) == PROMPT
        assert texts(assistant) == LOOKALIKE
        # the stored request keeps the conversation as sent; only the key header is replaced
        request = Attempt.objects.filter(run=run).order_by("index").first().request
        assert request["headers"]["x-api-key"] == "[redacted]"
        assert PROMPT in json.dumps(request["json"], ensure_ascii=False)
        # the API's thread view and the snapshot a (re)connecting client gets
        client = Client()
        client.force_login(owner)
        body = client.get(f"/streamrecover/api/threads/{run.thread_id}/").json()
        shown = [texts(m) for m in body["messages"]]
        assert shown == [PROMPT, LOOKALIKE]
        record = RunRecord(str(run.pk), "completed", None, {m.position: m.as_canonical() for m in (user, assistant)})
        assert [texts(m) for m in build_snapshot(record, None)["messages"]] == [PROMPT, LOOKALIKE]
        blob = json.dumps([list(Message.objects.values()), list(Attempt.objects.values("request"))], default=str)
        assert APP_KEY not in blob


@pytest.fixture(params=["orm", "redis"])
def real_store(request):
    if request.param == "orm":
        return DjangoCheckpointStore(ttl_s=60)
    return RedisCheckpointStore(django_settings.REDIS_URL, 60, prefix=f"test:{uuid.uuid4().hex}:")


async def test_a_resume_from_a_real_store_continues_the_unaltered_prefix(fake_server, real_store):
    reference = await engine_run(fake_server, PROMPT)
    answer = reference.assistant[0]["content"][0]["text"]
    assert answer == LOOKALIKE
    cut = answer.index("goes in the config")  # past both lookalikes, mid-answer
    run = await sync_to_async(lifecycle.create_run)(prompt="x")
    run_id = str(run.pk)
    # the checkpoint the interrupted execution left behind, written through the real store
    await real_store.put(
        Checkpoint(run_id=run_id, turn=0, history_len=1, blocks=[{"type": "text", "text": answer[:cut]}], seq=40)
    )
    stored = await real_store.get(run_id)
    # another execution resumes from it
    out = await engine_run(fake_server, PROMPT, checkpoints=real_store, run_id=run_id, resume=True)
    assert out.status == "completed"
    assert out.result.messages == reference.result.messages  # nothing duplicated, nothing altered
    assert [e.understood_as for e in out.log] == ["prefill"]
    assert out.log[0].prefix_matched is True
    assert stored is not None
    assert stored.blocks[0]["text"] == answer[:cut]
    assert await real_store.get(run_id) is None
    aclose = getattr(real_store, "aclose", None)
    if aclose is not None:
        await aclose()
    await StreamCheckpoint.objects.filter(run_id=run_id).adelete()
    await Run.objects.filter(pk=run_id).adelete()


def test_the_apps_own_key_in_a_prompt_or_the_output_is_cut_from_storage(fake_server, settings):
    """The one exception to stored == streamed (docs/recovery.md, "Secrets")."""
    prompt = f"Repeat {APP_KEY} [[text=The key is {APP_KEY} and Bearer abcdefghijklmnopqrstuvwx.]]"
    with override_settings(STREAMRECOVER={**settings.STREAMRECOVER, "PROVIDERS": providers(fake_server, "own-key")}):
        run = lifecycle.create_run(prompt=prompt, provider="fake", model="claude-3")
        result = asyncio.run(starter.execute_here(str(run.pk)))
    assert result is not None
    assert result.status == "completed"
    user, assistant = Message.objects.filter(thread_id=run.thread_id).order_by("position")
    assert texts(user) == prompt.replace(APP_KEY, "[redacted]")
    # the model never saw the key: it was cut from the prompt before it was stored and sent
    assert texts(assistant) == "The key is [redacted] and Bearer abcdefghijklmnopqrstuvwx."
    blob = json.dumps([list(Message.objects.values()), list(Attempt.objects.values("request"))], default=str)
    assert APP_KEY not in blob
