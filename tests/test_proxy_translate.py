"""A client's pass-through fields written for a fallback of another wire format: what has a
counterpart is translated, what has none is named as dropped, structured output to Anthropic is refused."""

from __future__ import annotations

from itertools import permutations
from typing import Any

import pytest

from streamrecover.proxy.inbound import ANTHROPIC, OPENAI, RESPONSES, Format
from streamrecover.proxy.translate import translate, wire_format

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# the same request's fields in each format: one function tool, that tool forced, no parallel calls, a stop
SAME: dict[Format, dict[str, Any]] = {
    ANTHROPIC: {
        "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "top_p": 0.5,
    },
    OPENAI: {
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA, "description": "Weather."}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "top_p": 0.5,
    },
    RESPONSES: {
        "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA, "description": "Weather."}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "top_p": 0.5,
    },
}


@pytest.mark.parametrize(("source", "target"), list(permutations(SAME, 2)))
def test_tools_and_tool_choice_have_a_counterpart_in_every_format(source: Format, target: Format) -> None:
    translated = translate(SAME[source], source, target)
    assert translated.refused is None
    assert translated.dropped == []
    assert translated.extra == SAME[target]


def test_what_has_no_counterpart_is_named_and_left_out() -> None:
    extra = {
        "tools": [{"type": "web_search_20250305", "name": "web_search"}, *SAME[ANTHROPIC]["tools"]],
        "stop_sequences": ["END"],
        "top_k": 3,
        "metadata": {"user_id": "u-1"},
    }
    to_responses = translate(extra, ANTHROPIC, RESPONSES)
    assert to_responses.dropped == ["top_k", "tools[0] (web_search_20250305)", "stop_sequences"]
    assert to_responses.extra == {"tools": SAME[RESPONSES]["tools"], "user": "u-1"}
    to_chat = translate(extra, ANTHROPIC, OPENAI)
    assert to_chat.extra["stop"] == ["END"]
    assert translate({"stop": "END", "user": "u-2"}, OPENAI, ANTHROPIC).extra == {
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-2"},
    }


def test_structured_output_translates_between_the_openai_formats_and_refuses_anthropic() -> None:
    schema = {"name": "answer", "schema": SCHEMA, "strict": True}
    chat = {"response_format": {"type": "json_schema", "json_schema": schema}}
    responses = {"text": {"format": {"type": "json_schema", **schema}}}
    assert translate(chat, OPENAI, RESPONSES).extra == responses
    assert translate(responses, RESPONSES, OPENAI).extra == chat
    refused = translate(chat, OPENAI, ANTHROPIC)
    assert refused.refused is not None
    assert "Anthropic" in refused.refused
    assert translate({"text": {"format": {"type": "text"}}}, RESPONSES, ANTHROPIC).refused is None


def test_reasoning_effort_between_the_openai_formats() -> None:
    assert translate({"reasoning_effort": "low"}, OPENAI, RESPONSES).extra == {"reasoning": {"effort": "low"}}
    assert translate({"reasoning": {"effort": "high"}}, RESPONSES, OPENAI).extra == {"reasoning_effort": "high"}
    assert translate({"reasoning": {"effort": "high"}}, RESPONSES, ANTHROPIC).dropped == ["reasoning"]


def test_the_same_format_passes_everything_unchanged() -> None:
    extra = {"tools": [{"type": "web_search"}], "anything": 1}
    assert translate(extra, RESPONSES, RESPONSES).extra == extra


def test_the_wire_format_of_a_provider() -> None:
    assert wire_format({"ADAPTER": "openai-responses", "BASE_URL": "https://x"}, "gpt-5") == RESPONSES
    assert wire_format({"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover"}, "gpt-4o") == OPENAI
    assert wire_format({"ADAPTER": "anthropic", "BASE_URL": "fake://streamrecover"}, "claude-x") == ANTHROPIC
    assert wire_format({"ADAPTER": "gemini", "BASE_URL": "https://x"}, "gemini-2.5-pro") is None


def test_token_logprobs_are_asked_for_in_the_other_openai_formats_terms() -> None:
    """Chat's ``logprobs: true`` is Responses' ``include`` of the output text's logprobs, and back;
    ``top_logprobs`` goes as it is. Anthropic has none: they are named as dropped."""
    chat = {"logprobs": True, "top_logprobs": 2}
    responses = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    to_responses = translate(chat, OPENAI, RESPONSES)
    assert (to_responses.extra, to_responses.dropped) == (responses, [])
    to_chat = translate(
        {**responses, "include": ["reasoning.encrypted_content", *responses["include"]]}, RESPONSES, OPENAI
    )
    assert (to_chat.extra, to_chat.dropped) == (chat, ["include (reasoning.encrypted_content)"])
    assert translate(chat, OPENAI, ANTHROPIC).dropped == ["logprobs", "top_logprobs"]
    assert translate(responses, RESPONSES, ANTHROPIC).dropped == [
        "top_logprobs",
        "include (message.output_text.logprobs)",
    ]
    assert translate({"logprobs": False}, OPENAI, RESPONSES).dropped == ["logprobs"]
