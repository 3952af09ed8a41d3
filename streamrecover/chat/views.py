"""The chat page's view: GET shows a thread, POST starts a run in it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.mixins import LoginRequiredMixin
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.views import View

from .. import dispatch
from ..conf import app_settings
from ..models import Message, Run, Thread
from ..runs import lifecycle
from ..views import RUN_SOCKET, THREAD_SOCKET, BadRequest, _run_options, ws_url
from .notice import recovery_notice

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class ChatForm(forms.Form):
    # stored as the user wrote it, leading and trailing whitespace included (the JSON API does
    # the same); a message of whitespace alone is still no message
    prompt = forms.CharField(label=_("Message"), strip=False, widget=forms.Textarea)
    # any name in STREAMRECOVER["PROVIDERS"] (empty: DEFAULT_PROVIDER); checked as the JSON API checks it
    provider = forms.CharField(label=_("Provider"), required=False, strip=True)
    model = forms.CharField(label=_("Model"), required=False, strip=True)

    def clean_prompt(self) -> str:
        prompt: str = self.cleaned_data["prompt"]
        if not prompt.strip():
            raise forms.ValidationError(self.fields["prompt"].error_messages["required"], code="required")
        return prompt


class ChatView(LoginRequiredMixin, View):
    """The chat page: the user's threads, a thread's messages, and a form that posts a message.

    ``url_names`` are resolved in the namespace the view is mounted under (``chat`` and
    ``chat-thread``), so a subclass mounted under another namespace keeps working.
    """

    template_name = "streamrecover/chat/chat.html"
    form_class: type[forms.Form] = ChatForm
    http_method_names = ["get", "post"]

    # -- hooks for subclasses ----------------------------------------------------------

    def run_options(self, form: forms.Form) -> dict[str, Any]:
        """The JSON API's run fields from the valid form (``prompt``, ``provider``, ``model``, ``faults``...)."""
        options: dict[str, Any] = {"prompt": form.cleaned_data["prompt"]}
        for field in ("provider", "model"):
            if form.cleaned_data.get(field):
                options[field] = form.cleaned_data[field]
        return options

    def get_config(self, thread: Thread | None, run: Run | None) -> dict[str, Any]:
        """What ``chat.js`` reads from the page (``json_script``)."""
        return {
            "threadId": thread.pk if thread else None,
            "runId": str(run.pk) if run else None,
            "wsUrl": ws_url(run) if run else None,
            "urls": {
                "thread": self._url("chat-thread", 0).replace("/0/", "/{id}/"),
                "run": reverse("streamrecover:api-run", args=[_ZERO_UUID]).replace(_ZERO_UUID, "{id}"),
                # the page's way to cancel while its socket is reconnecting
                "cancel": reverse("streamrecover:api-run-cancel", args=[_ZERO_UUID]).replace(_ZERO_UUID, "{id}"),
                # the sockets: a run's, and the thread's, which announces each run started in it
                "runSocket": RUN_SOCKET,
                "threadSocket": THREAD_SOCKET,
            },
        }

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def get_initial(self) -> dict[str, Any]:
        """The empty form's initial values (a GET's form)."""
        return {}

    # -- GET and POST --------------------------------------------------------------------

    def get(self, request: HttpRequest, thread_id: int | None = None) -> HttpResponse:
        return self.render_page(request, self._thread(request, thread_id), self.form_class(initial=self.get_initial()))

    def post(self, request: HttpRequest, thread_id: int | None = None) -> HttpResponseBase:
        thread = self._thread(request, thread_id)
        form = self.form_class(request.POST)
        wants_json = "application/json" in request.headers.get("accept", "")
        if not form.is_valid():
            if wants_json:
                return JsonResponse({"error": _form_errors(form)}, status=400)
            return self.render_page(request, thread, form, status=400)
        try:
            options = _run_options(self.run_options(form))
            with transaction.atomic():
                run = lifecycle.create_run(owner=request.user, thread=thread, **options)
                dispatch.enqueue_run(run)
        except BadRequest as exc:
            error, status = str(exc), 400
        except lifecycle.ThreadBusy:
            error, status = str(_("This thread has a run in progress: wait for it or cancel it.")), 409
            busy = Run.objects.filter(thread=thread).active().order_by("-created").first()
            if wants_json and busy is not None:
                # the run it waits for (another tab's): the script follows it, so its Cancel works
                body = {"error": error, "run_id": str(busy.pk), "status": busy.status, "ws_url": ws_url(busy)}
                return JsonResponse(body, status=status)
        else:
            if wants_json:
                # the thread's stored title, for the sidebar: the script never cuts the prompt itself
                body = {
                    "run_id": str(run.pk),
                    "thread_id": run.thread_id,
                    "title": run.thread.title,
                    "status": run.status,
                    "ws_url": ws_url(run),
                }
                return JsonResponse(body, status=201)
            return redirect(self._url("chat-thread", run.thread_id))
        if wants_json:
            return JsonResponse({"error": error}, status=status)
        form.add_error(None, error)
        return self.render_page(request, thread, form, status=status)

    def render_page(
        self, request: HttpRequest, thread: Thread | None, form: forms.Form, *, status: int = 200
    ) -> HttpResponse:
        run = Run.objects.filter(thread=thread).order_by("-created").first() if thread else None
        action = self._url("chat-thread", thread.pk) if thread else self._url("chat")
        user = request.user  # (signed in: LoginRequiredMixin)
        threads = Thread.objects.filter(owner=user) if user.is_authenticated else Thread.objects.none()
        active = bool(run and run.status in Run.ACTIVE_STATUSES)
        context = self.get_context_data(
            threads=threads.order_by("-created")[:100],
            thread=thread,
            run=run,
            run_active=active,
            # a run that is over says how it was recovered (or gave up), as the live page did
            recovery_notice=None if active else recovery_notice(run),
            thread_messages=Message.objects.of_thread(thread.pk).canonical() if thread else [],
            form=form,
            form_action=action,
            chat_url=self._url("chat"),
            providers=sorted(app_settings.PROVIDERS),
            default_provider=app_settings.DEFAULT_PROVIDER,
            config=self.get_config(thread, run),
        )
        return render(request, self.template_name, context, status=status)

    def _thread(self, request: HttpRequest, thread_id: int | None) -> Thread | None:
        if thread_id is None:
            return None
        return get_object_or_404(Thread, pk=thread_id, owner=request.user)

    def _url(self, name: str, *args: Any) -> str:
        match = self.request.resolver_match
        namespace = match.namespace if match is not None and match.namespace else "streamrecover_chat"
        return reverse(f"{namespace}:{name}", args=args)


def _form_errors(form: forms.Form) -> str:
    parts = []
    for field, errors in form.errors.items():
        said = " ".join(str(error) for error in errors)
        parts.append(said if field == "__all__" else f"{field}: {said}")
    return " ".join(parts)
