"""The fake reads directives from the system prompt too, in every wire format, so a caller (the
demo's fault scenarios) can steer it without writing into a user's message."""

from __future__ import annotations

import uuid

import anthropic
import openai

from streamrecover.testing.fake import FakeProviderServer

EXACT = "Exactly these words, from the system prompt."
SYSTEM = f"You are terse. [[text={EXACT}]]"


def _headers() -> dict[str, str]:
    return {"x-fake-scenario": uuid.uuid4().hex}


def test_anthropic_system_as_a_string_and_as_blocks(fake_server: FakeProviderServer) -> None:
    client = anthropic.Anthropic(api_key="sk-ant-fake", base_url=fake_server.base_url, default_headers=_headers())
    messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Hello there"}]
    plain = client.messages.create(model="claude-sonnet-4-5", max_tokens=256, system=SYSTEM, messages=messages)
    blocks = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=256,
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": f" [[text={EXACT}]]"}],
        messages=messages,
    )
    unsteered = client.messages.create(model="claude-sonnet-4-5", max_tokens=256, messages=messages)
    assert [b.text for b in plain.content if b.type == "text"] == [EXACT]
    assert [b.text for b in blocks.content if b.type == "text"] == [EXACT]
    assert [b.text for b in unsteered.content if b.type == "text"] != [EXACT]


def test_openai_chat_system_and_developer_messages(fake_server: FakeProviderServer) -> None:
    client = openai.OpenAI(api_key="sk-fake", base_url=f"{fake_server.base_url}/v1", default_headers=_headers())
    for role in ("system", "developer"):
        answer = client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": role, "content": SYSTEM}, {"role": "user", "content": "Hello there"}],  # type: ignore[misc]
        )
        assert answer.choices[0].message.content == EXACT, role


def test_openai_responses_instructions(fake_server: FakeProviderServer) -> None:
    client = openai.OpenAI(api_key="sk-fake", base_url=f"{fake_server.base_url}/v1", default_headers=_headers())
    answer = client.responses.create(model="gpt-4.1", instructions=SYSTEM, input="Hello there")
    assert answer.output_text == EXACT


def test_gemini_system_instruction(fake_server: FakeProviderServer) -> None:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=fake_server.base_url, headers=_headers())
    client = genai.Client(api_key="AIza-fake", http_options=options)
    config = types.GenerateContentConfig(system_instruction=SYSTEM)
    answer = client.models.generate_content(model="gemini-2.5-flash", contents="Hello there", config=config)
    assert answer.text == EXACT


def test_the_prompts_own_directive_wins_and_the_topic_is_the_prompts(fake_server: FakeProviderServer) -> None:
    client = anthropic.Anthropic(api_key="sk-ant-fake", base_url=fake_server.base_url, default_headers=_headers())
    mine = "Mine, as I asked."
    answer = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=256,
        system="[[words=5]] [[text=Not this one.]]",
        messages=[{"role": "user", "content": f"Say it [[text={mine}]]"}],
    )
    assert [b.text for b in answer.content if b.type == "text"] == [mine]
    counted = client.messages.create(
        model="claude-sonnet-4-5",
        max_tokens=256,
        system="[[words=5]]",
        messages=[{"role": "user", "content": "Tell me about lighthouses"}],
    )
    assert len(counted.content[0].text.split()) == 5  # type: ignore[union-attr]
