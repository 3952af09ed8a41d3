"""The demo chat: log in, pick a thread, ask, and watch the answer survive broken streams.

The page is a plain template; ``static/demo/chat.js`` starts runs through the
JSON API and follows them with ``client.js`` over the run's WebSocket. The fault
scenarios script the built-in fake provider so a visitor can watch each recovery plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView, LogoutView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse, reverse_lazy

from streamrecover.models import Run, Thread
from streamrecover.views import ws_url

# The fake's planned answer with this text before the tool call has its tool-argument
# deltas from SSE event 15 on (a test pins that every scenario gives its plan).
R3_TOOL_TEXT = "Let me check the weather for you."


@dataclass(frozen=True, slots=True)
class Scenario:
    """A fault script for the fake provider, and what the request needs for it to bite."""

    key: str
    label: str
    faults: tuple[str, ...] = ()
    suffix: str = ""  # prompt directives appended to what the visitor typed
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
        suffix=f" [[text={R3_TOOL_TEXT}]] [[tool=get_weather]]",
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


def _page_config(thread: Thread | None, run: Run | None) -> dict[str, Any]:
    return {
        "threadId": thread.pk if thread else None,
        "runId": str(run.pk) if run else None,
        "wsUrl": ws_url(run) if run else None,
        "urls": {
            "runs": reverse("streamrecover:api-runs"),
            "thread": reverse("demo:chat-thread", args=[0]).replace("/0/", "/{id}/"),
            "run": reverse("streamrecover:api-run", args=["00000000-0000-0000-0000-000000000000"]).replace(
                "00000000-0000-0000-0000-000000000000", "{id}"
            ),
        },
        "scenarios": [asdict(s) for s in SCENARIOS],
    }


@login_required(login_url=reverse_lazy("demo:login"))
def chat(request: HttpRequest, thread_id: int | None = None) -> HttpResponse:
    """The chat page; with a thread, it follows the thread's latest run from its snapshot."""
    thread = get_object_or_404(Thread, pk=thread_id, owner=request.user) if thread_id is not None else None
    run = Run.objects.filter(thread=thread).order_by("-created").first() if thread else None
    context = {
        "threads": Thread.objects.filter(owner=request.user).order_by("-created")[:100],
        "thread": thread,
        "scenarios": SCENARIOS,
        "config": _page_config(thread, run),
    }
    return render(request, "demo/chat.html", context)


class ChatLoginView(LoginView):
    """Django's login view with the demo's template; back to the chat afterwards."""

    template_name = "demo/login.html"
    redirect_authenticated_user = True
    next_page = reverse_lazy("demo:chat")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["show_demo_login"] = settings.DEBUG
        return context


class ChatLogoutView(LogoutView):
    next_page = reverse_lazy("demo:login")
