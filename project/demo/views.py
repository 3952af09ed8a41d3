"""The demo chat: log in, pick a thread, ask, and watch the answer survive broken streams.

The page is the app's opt-in chat page (``streamrecover.chat``) with the demo's extras: a
fault chooser whose scenarios script the built-in fake provider so a visitor can watch each
recovery plan, the demo's login page, and links to the analytics page and to log out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.views import LoginView, LogoutView
from django.http import HttpRequest, HttpResponseBase
from django.urls import reverse_lazy

from streamrecover.chat.views import ChatForm, ChatView
from streamrecover.models import Run, Thread

# The fake's planned answer with this text before the tool call has its tool-argument
# deltas from SSE event 15 on (a test pins that every scenario gives its plan).
R3_TOOL_TEXT = "Let me check the weather for you."


@dataclass(frozen=True, slots=True)
class Scenario:
    """A fault script for the fake provider, and what the request needs for it to bite."""

    key: str
    label: str
    faults: tuple[str, ...] = ()
    # the fake's directives, sent as the run's system prompt: what the visitor typed is
    # stored and shown as typed
    directives: str = ""
    demo_tools: bool = False
    max_tokens: int | None = None
    thinking_budget: int | None = None
    max_continuations: int | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("none", "No fault"),
    Scenario("r1", "R1 continue_text: the connection is cut in the middle of the text", ("cut:bytes=1500",)),
    Scenario(
        "r3",
        "R3 truncate_before_tool: cut inside a tool call's arguments",
        ("cut:events=15",),
        directives=f"[[text={R3_TOOL_TEXT}]] [[tool=get_weather]]",
        demo_tools=True,
    ),
    Scenario(
        "r4",
        "R4 whole_restart: cut while thinking, before any text",
        ("cut:events=8",),
        max_tokens=4096,
        thinking_budget=1024,
    ),
    Scenario(
        "overloaded",
        "overloaded_error event in the middle of the stream",
        ("error:events=30,type=overloaded_error,message=Overloaded",),
    ),
    Scenario(
        "exhausted",
        "Exhaustion: every continuation breaks as well",
        ("cut:bytes=1500", "cut:events=6", "cut:events=6"),
        max_continuations=2,
    ),
)
SCENARIO_BY_KEY = {s.key: s for s in SCENARIOS}
# the visitor's last chosen scenario, kept in the session: the chooser shows it again after a
# reload or in another thread, with or without JavaScript, until the visitor picks another
SESSION_SCENARIO = "demo_scenario"


class DemoChatForm(ChatForm):
    scenario = forms.ChoiceField(choices=[(s.key, s.label) for s in SCENARIOS], initial="none", required=False)


class DemoChatView(ChatView):
    """The app's chat page with the fault chooser; logging in is the demo's own page."""

    template_name = "demo/chat.html"
    form_class = DemoChatForm
    login_url = reverse_lazy("demo:login")

    def run_options(self, form: forms.Form) -> dict[str, Any]:
        scenario = SCENARIO_BY_KEY[form.cleaned_data.get("scenario") or "none"]
        options: dict[str, Any] = {
            "prompt": form.cleaned_data["prompt"],
            "system": scenario.directives or None,
            "faults": list(scenario.faults),
            "demo_tools": scenario.demo_tools,
        }
        if scenario.max_tokens:
            options["max_tokens"] = scenario.max_tokens
        if scenario.thinking_budget:
            options["thinking_budget"] = scenario.thinking_budget
        if scenario.max_continuations is not None:
            options["max_continuations"] = scenario.max_continuations
        return options

    def get_config(self, thread: Thread | None, run: Run | None) -> dict[str, Any]:
        return {**super().get_config(thread, run), "scenarios": [asdict(s) for s in SCENARIOS]}

    def get_initial(self) -> dict[str, Any]:
        key = self.request.session.get(SESSION_SCENARIO)
        return {"scenario": key} if key in SCENARIO_BY_KEY else {}

    def post(self, request: HttpRequest, thread_id: int | None = None) -> HttpResponseBase:
        key = request.POST.get("scenario")
        if key in SCENARIO_BY_KEY and request.session.get(SESSION_SCENARIO) != key:
            request.session[SESSION_SCENARIO] = key  # (a write only when it changes)
        return super().post(request, thread_id)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "scenarios": SCENARIOS}


chat = DemoChatView.as_view()


class ChatLoginView(LoginView):
    """Django's login view with the demo's template; back to the chat afterwards."""

    template_name = "demo/login.html"
    redirect_authenticated_user = True
    next_page = reverse_lazy("demo:chat")  # type: ignore[assignment]  # (stubs say str; Django takes a lazy one)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["show_demo_login"] = settings.DEBUG
        return context


class ChatLogoutView(LogoutView):
    next_page = reverse_lazy("demo:login")  # type: ignore[assignment]  # (stubs say str; Django takes a lazy one)
