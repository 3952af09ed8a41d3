"""A custom ``ADAPTER``: one lacking members of ``ProviderAdapter``, or with only some of
``ResumableAdapter``'s, is refused at start-up with each named, a complete one streams a run;
docs/providers.md "Writing an adapter" lists every member."""

from __future__ import annotations

import inspect
import io
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from streamrecover import checks
from streamrecover.conf import app_settings, validate
from streamrecover.engine.contract import (
    HTTPRequest,
    ModelRequest,
    ProviderAdapter,
    ProviderConfig,
    ResumableAdapter,
    ResumableParser,
    ResumePoint,
    Strategy,
    StreamParser,
    ThinkingRule,
    resumes_natively,
)
from streamrecover.engine.errors import ProviderError
from streamrecover.engine.events import ProviderErrorEvent
from streamrecover.models import Run
from streamrecover.providers.anthropic import AnthropicAdapter, AnthropicStreamParser
from streamrecover.providers.registry import ADAPTERS, get_adapter, register_adapter
from streamrecover.testing.fake import FakeProviderServer

SECRET = "sk-ant-api03-CUSTOM-ADAPTER-SECRET-0123456789"
HEADER = "x-route-model"
HERE = __name__


class Incomplete:
    """An adapter written before ``thinking_rule``, ``count_request`` and ``read_count`` were
    members of ``ProviderAdapter``: a wrapper forwarding the others to the built-in."""

    name = "written-before"

    def __init__(self, config: ProviderConfig) -> None:
        self.inner = AnthropicAdapter(config)

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        built = self.inner.build_request(request)
        return replace(built, headers={**built.headers, HEADER: request.model})

    def new_parser(self) -> AnthropicStreamParser:
        return self.inner.new_parser()

    def classify_http_error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        return self.inner.classify_http_error(status, headers, body)

    def classify_stream_error(self, event: ProviderErrorEvent) -> ProviderError:
        return self.inner.classify_stream_error(event)

    def continuation_strategy(self, model: str, *, thinking: bool) -> Strategy:
        return self.inner.continuation_strategy(model, thinking=thinking)

    @property
    def echoes_prefix(self) -> bool:
        return self.inner.echoes_prefix

    @property
    def text_delta_is_token(self) -> bool:
        return self.inner.text_delta_is_token

    @property
    def min_max_tokens(self) -> int:
        return self.inner.min_max_tokens


class Complete(Incomplete):
    """``Incomplete`` with the members added since: a wrapper forwarding every member to the built-in."""

    name = "complete"

    def thinking_rule(self, model: str) -> ThinkingRule:
        return self.inner.thinking_rule(model)

    def count_request(self, request: ModelRequest) -> HTTPRequest | None:
        return self.inner.count_request(request)

    def read_count(self, body: bytes) -> int | None:
        return self.inner.read_count(body)


class Routed(AnthropicAdapter):
    """docs/providers.md's minimal adapter: the built-in with a header naming the model."""

    name = "routed-anthropic"

    def build_request(self, request: ModelRequest) -> HTTPRequest:
        built = super().build_request(request)
        return replace(built, headers={**built.headers, HEADER: request.model})


class Declared(Incomplete, ProviderAdapter):
    """Subclasses the protocol: its members without a body are not the adapter's."""


class Assigned:
    """Every member set on the instance, none on the class."""

    def __init__(self, config: ProviderConfig) -> None:
        inner = Complete(config)
        self.name = "assigned"
        self.build_request = inner.build_request
        self.new_parser = inner.new_parser
        self.classify_http_error = inner.classify_http_error
        self.classify_stream_error = inner.classify_stream_error
        self.continuation_strategy = inner.continuation_strategy
        self.echoes_prefix = self.text_delta_is_token = False
        self.min_max_tokens = 1
        self.thinking_rule = inner.thinking_rule
        self.count_request = inner.count_request
        self.read_count = inner.read_count


class Forwarding:
    """Forwards whatever it lacks to the built-in (validation cannot see what that gives)."""

    def __init__(self, config: ProviderConfig) -> None:
        self.inner = AnthropicAdapter(config)

    def __getattr__(self, member: str) -> Any:
        return getattr(self.inner, member)


class ForwardingIncomplete(Forwarding):
    """Forwards to an adapter without ``thinking_rule`` and the count."""

    def __init__(self, config: ProviderConfig) -> None:
        self.inner = Incomplete(config)


class ResumeFlagOnly(Complete):
    """Says it resumes natively, without the requests that would do it."""

    native_resume = True


class HalfResumable(Complete):
    """Can re-attach to a response (``native_resume`` set in ``__init__``) but not stop one."""

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        self.native_resume = config.native_resume

    def resume_request(self, point: ResumePoint) -> HTTPRequest:
        return HTTPRequest("GET", f"https://mine.invalid/responses/{point.response_id}", {}, {})


class Resumable(HalfResumable):
    """Every member of ``ResumableAdapter``."""

    def cancel_request(self, response_id: str) -> HTTPRequest:
        return HTTPRequest("POST", f"https://mine.invalid/responses/{response_id}/cancel", {}, {})


class IncompleteHalfResumable(Incomplete):
    """Lacks members of both protocols."""

    native_resume = False


class ForwardingHalfResumable(Forwarding):
    """Forwards to an adapter with only some of ``ResumableAdapter``'s members."""

    def __init__(self, config: ProviderConfig) -> None:
        self.inner = HalfResumable(config)


def half_resumable_factory(config):
    return HalfResumable(config)


def annotated_factory(config: ProviderConfig) -> Incomplete:
    return Incomplete(config)


def unannotated_factory(config):
    return Incomplete(config)


LACKING = "thinking_rule, count_request, read_count"


def _problems(adapter: str) -> list[str]:
    entry = {"ADAPTER": adapter, "BASE_URL": "https://mine.invalid", "API_KEY": SECRET}
    return validate({"PROVIDERS": {"mine": entry}})


def test_validation_names_the_provider_the_adapter_and_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ADAPTERS, "registered-incomplete", Incomplete)
    said = {
        path: _problems(path)
        for path in (
            f"{HERE}.Incomplete",
            f"{HERE}.Declared",  # the protocol's stubs are no implementation
            f"{HERE}.annotated_factory",  # the class its return annotation names
            "registered-incomplete",
            f"{HERE}.Complete",
            f"{HERE}.Routed",
            f"{HERE}.Assigned",  # members set in __init__ are there
            f"{HERE}.Forwarding",  # __getattr__: checked when built (below)
            f"{HERE}.unannotated_factory",  # nothing to see without calling it: checked when built
        )
    }

    def lacks(adapter: str) -> list[str]:
        return [
            f"STREAMRECOVER['PROVIDERS']['mine']['ADAPTER']: provider adapter {adapter!r} lacks {LACKING} of "
            "ProviderAdapter (streamrecover.engine.contract): see docs/providers.md 'Writing an adapter'."
        ]

    assert said == {
        f"{HERE}.Incomplete": lacks(f"{HERE}.Incomplete"),
        f"{HERE}.Declared": lacks(f"{HERE}.Declared"),
        f"{HERE}.annotated_factory": lacks(f"{HERE}.annotated_factory"),
        "registered-incomplete": lacks("registered-incomplete"),
        f"{HERE}.Complete": [],
        f"{HERE}.Routed": [],
        f"{HERE}.Assigned": [],
        f"{HERE}.Forwarding": [],
        f"{HERE}.unannotated_factory": [],
    }
    assert SECRET not in json.dumps(said)


def test_settings_and_the_system_check_refuse_an_incomplete_adapter() -> None:
    providers = {"mine": {"ADAPTER": f"{HERE}.Incomplete", "BASE_URL": "https://mine.invalid", "API_KEY": SECRET}}
    with override_settings(STREAMRECOVER={"PROVIDERS": providers}):
        found = checks.check_settings()
        with pytest.raises(ImproperlyConfigured, match=f"lacks {LACKING} of ProviderAdapter") as raised:
            app_settings.provider_config("mine")
    assert [m.id for m in found] == ["streamrecover.E001"]
    assert f"['mine']['ADAPTER']: provider adapter '{HERE}.Incomplete' lacks {LACKING}" in found[0].msg
    assert "Writing an adapter" in found[0].msg
    assert SECRET not in found[0].msg + str(raised.value)


@pytest.mark.parametrize("factory", ["unannotated_factory", "ForwardingIncomplete"])
def test_an_adapter_that_shows_only_when_built_is_refused_before_any_request(factory: str) -> None:
    config = ProviderConfig(name=f"{HERE}.{factory}", base_url="https://mine.invalid", api_key=SECRET)
    with pytest.raises(ValueError, match=f"provider adapter '{HERE}.{factory}' lacks {LACKING} of") as raised:
        get_adapter(config)
    assert SECRET not in str(raised.value)
    for complete in ("Complete", "Routed", "Assigned", "Forwarding"):
        assert get_adapter(replace(config, name=f"{HERE}.{complete}")) is not None


RESUMABLE_LACKS = {
    "ResumeFlagOnly": "resume_request, cancel_request of ResumableAdapter (streamrecover.engine.contract): "
    "it has native_resume,",
    "HalfResumable": "cancel_request of ResumableAdapter (streamrecover.engine.contract): "
    "it has native_resume, resume_request,",
}


def test_validation_refuses_an_adapter_with_only_some_members_of_resumable_adapter() -> None:
    """Before, such an adapter passed and was taken for one that does not resume natively: its
    ``NATIVE_RESUME`` did nothing, or a break failed on the member it lacks."""
    for adapter, lacks in RESUMABLE_LACKS.items():
        (problem,) = _problems(f"{HERE}.{adapter}")
        assert f"provider adapter '{HERE}.{adapter}' lacks {lacks} and an adapter has all" in problem
        assert "of ResumableAdapter's members or none; see docs/providers.md 'Writing an adapter'." in problem
    (both,) = _problems(f"{HERE}.IncompleteHalfResumable")
    assert f"lacks {LACKING} of ProviderAdapter and resume_request, cancel_request of ResumableAdapter" in both
    for whole in ("Complete", "Routed", "Resumable"):  # none of its members, or all
        assert _problems(f"{HERE}.{whole}") == []
    assert _problems("openai-responses") == []


@pytest.mark.parametrize("factory", ["HalfResumable", "half_resumable_factory", "ForwardingHalfResumable"])
def test_get_adapter_refuses_an_adapter_with_only_some_members_of_resumable_adapter(factory: str) -> None:
    config = ProviderConfig(name=f"{HERE}.{factory}", base_url="https://mine.invalid", native_resume=True)
    lacks = f"provider adapter '{HERE}.{factory}' lacks {RESUMABLE_LACKS['HalfResumable']}"
    with pytest.raises(ValueError, match=re.escape(lacks)):
        get_adapter(config)
    assert resumes_natively(get_adapter(replace(config, name=f"{HERE}.Resumable")))
    assert get_adapter(replace(config, name="openai-responses")) is not None


def test_register_adapter_refuses_what_validation_would_and_keeps_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, ``register_adapter`` took anything, and the mistake showed only when a provider
    named the adapter (or mid-run, for a factory whose class does not show)."""
    monkeypatch.setattr("streamrecover.providers.registry.ADAPTERS", dict(ADAPTERS))
    from streamrecover.providers import registry

    before = dict(registry.ADAPTERS)
    refused: dict[str, Any] = {
        f"provider adapter 'mine' lacks {LACKING} of ProviderAdapter": Incomplete,
        f"provider adapter 'mine' lacks {RESUMABLE_LACKS['HalfResumable']}": HalfResumable,
        f"provider adapter 'mine' lacks {LACKING} of ProviderAdapter and resume_request": IncompleteHalfResumable,
        "provider adapter 'mine': the factory 'not a factory' is not callable": "not a factory",
    }
    for says, factory in refused.items():
        with pytest.raises(ValueError, match=re.escape(says)):
            register_adapter("mine", factory)
    for name in ("", None):
        with pytest.raises(ValueError, match="an adapter's name is a non-empty string"):
            register_adapter(name, Complete)  # type: ignore[arg-type]
    assert before == registry.ADAPTERS
    added = {"complete": Complete, "resumable": Resumable, "unseen": unannotated_factory}
    for name, factory in added.items():
        register_adapter(name, factory)
    assert {**before, **added} == registry.ADAPTERS
    assert _problems("complete") == []
    assert _problems("resumable") == []
    with pytest.raises(ValueError, match=f"provider adapter 'unseen' lacks {LACKING}"):  # shows only when built
        get_adapter(ProviderConfig(name="unseen", base_url="https://mine.invalid"))


@pytest.mark.django_db(transaction=True)
def test_a_custom_adapter_streams_a_run_through_a_break(fake_server: FakeProviderServer, settings: Any) -> None:
    """Refused as the command starts while it lacks members; complete (a wrapper forwarding every
    member, or the docs' subclass), it streams, is cut, and is continued through its own requests."""
    scenario = uuid.uuid4().hex

    def run(adapter: str) -> dict[str, Any]:
        provider = {
            "ADAPTER": f"{HERE}.{adapter}",
            "BASE_URL": fake_server.base_url,
            "API_KEY": SECRET,
            "EXTRA_HEADERS": {"x-fake-scenario": scenario},
        }
        value = {**settings.STREAMRECOVER, "BACKOFF_SCALE": 0, "PROVIDERS": {"mine": provider}}
        value["DEFAULT_PROVIDER"] = "mine"
        out = io.StringIO()
        with override_settings(STREAMRECOVER=value):
            argv = ["--provider", "mine", "--model", "claude-3", "--prompt", "A tale [[words=80]]", "--json"]
            call_command("streamrecover_run", *argv, stdout=out)
        return dict(json.loads(out.getvalue()))

    with pytest.raises(CommandError, match=f"lacks {LACKING} of ProviderAdapter"):
        run("Incomplete")
    assert not Run.objects.exists()
    assert fake_server.log_for(scenario) == []
    for adapter in ("Complete", "Routed"):
        fake_server.reset(scenario)
        fake_server.set_faults(scenario, ["cut:bytes=1500"])
        output = run(adapter)
        assert output["status"] == "completed", output
        calls = [e for e in fake_server.log_for(scenario) if e.path == "/v1/messages"]
        assert [e.understood_as for e in calls] == ["fresh", "prefill"]
        assert [e.headers.get(HEADER) for e in calls] == ["claude-3", "claude-3"]  # the adapter's own requests
        assert SECRET not in json.dumps(output)


# -- docs/providers.md "Writing an adapter" lists every member of the adapter protocols -----------------

DOCS = Path(__file__).resolve().parents[1] / "docs" / "providers.md"
PROTOCOLS: tuple[type, ...] = (ProviderAdapter, StreamParser, ResumableAdapter, ResumableParser)
HEADING = re.compile(r"^### `(\w+)`", re.M)
MEMBER = re.compile(r"^- \*\*`(\w+)", re.M)


def documented() -> dict[str, list[str]]:
    """Each protocol's heading in the section -> the member names its list gives, in order."""
    section = DOCS.read_text(encoding="utf-8").split("\n## Writing an adapter\n", 1)[1].split("\n## ", 1)[0]
    parts = HEADING.split(section)[1:]
    return {name: MEMBER.findall(body) for name, body in zip(parts[::2], parts[1::2], strict=True)}


def members(protocol: type) -> set[str]:
    """What a class must have to fulfil ``protocol``: its public attributes, methods, properties and
    annotations (``Protocol``'s own machinery is private)."""
    found = {name for name, _ in inspect.getmembers(protocol) if not name.startswith("_")}
    return found | {name for name in inspect.get_annotations(protocol) if not name.startswith("_")}


def test_the_docs_list_every_member_of_each_adapter_protocol() -> None:
    listed = documented()
    assert {name: sorted(names) for name, names in listed.items()} == {
        protocol.__name__: sorted(members(protocol)) for protocol in PROTOCOLS
    }
    assert all(len(names) == len(set(names)) for names in listed.values()), "a member is listed twice"


def test_the_docs_reader_sees_a_member_added() -> None:
    """The comparison is not vacuous: a protocol with one member more is not what the docs list."""

    class Grown(ProviderAdapter):
        def new_member(self) -> None: ...

    assert "new_member" in members(Grown)
    assert members(ProviderAdapter) == set(documented()["ProviderAdapter"])
    assert "thinking_rule" in members(ProviderAdapter)
