"""Query logic for runs, messages, attempts and recovery events, kept off the models."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.contrib.auth import get_permission_codename
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from .conf import app_settings
from .engine.sink import LLM_STREAM_CONTINUATION_COMPLETED

if TYPE_CHECKING:
    from django.db.models.options import Options


class Requester(Protocol):
    """A request's user, signed in or not: Django's ``User``, a custom user model with
    ``PermissionsMixin`` (the admin needs it too), ``AnonymousUser``."""

    @property
    def is_authenticated(self) -> bool: ...

    def has_perm(self, perm: str, obj: Any = None) -> bool: ...


def has_model_permission(user: Requester | None, action: str, opts: Options[Any]) -> bool:
    """Whether ``user`` holds ``<app>.<action>_<model>`` for the model of ``opts`` (``is_staff``
    alone grants nothing: the admin's rule)."""
    if user is None or not user.is_authenticated:
        return False
    return bool(user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}"))


class RunQuerySet(models.QuerySet):
    def active(self) -> RunQuerySet:
        """Queued or being worked on."""
        return self.filter(status__in=self.model.ACTIVE_STATUSES)

    def terminal(self) -> RunQuerySet:
        """Finished one way or another; never claimed again."""
        return self.filter(status__in=self.model.TERMINAL_STATUSES)

    def stale(self, now: datetime | None = None, seconds: float | None = None) -> RunQuerySet:
        """Claimed runs whose worker stopped beating: the sweeper re-queues these.

        A claimed run without any heartbeat counts from its start (or creation).
        """
        if seconds is None:
            seconds = app_settings.STALE_AFTER_SECONDS
        cutoff = (now or timezone.now()) - timedelta(seconds=seconds)
        never_beat = Q(heartbeat_at__isnull=True) & (
            Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created__lt=cutoff)
        )
        return self.filter(status__in=self.model.CLAIMED_STATUSES).filter(Q(heartbeat_at__lt=cutoff) | never_beat)

    def stuck_queued(self, now: datetime | None = None, seconds: float | None = None) -> RunQuerySet:
        """Queued runs nobody claimed for longer than ``QUEUED_STALE_AFTER_SECONDS``: the sweeper
        hands these to the workers again (their process restarted, their message was lost).

        A queued run counts from when it was last put in the queue (``heartbeat_at``, set by a
        re-queue or a sweep) or else from its creation.
        """
        if seconds is None:
            seconds = app_settings.QUEUED_STALE_AFTER_SECONDS
        cutoff = (now or timezone.now()) - timedelta(seconds=seconds)
        return self.filter(status=self.model.Status.QUEUED).filter(
            Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created__lt=cutoff)
        )

    def for_owner(self, user: Requester | None) -> RunQuerySet:
        """Runs owned by ``user``; nothing for anonymous users."""
        if user is None or not user.is_authenticated:
            return self.none()
        return self.filter(owner=user)

    def may_view_all(self, user: Requester | None) -> bool:
        """Whether ``user`` may read runs (and their threads) that are not theirs: with the
        permission the admin asks for, ``view_run`` or ``change_run`` (superusers have both)."""
        opts = self.model._meta
        return has_model_permission(user, "view", opts) or has_model_permission(user, "change", opts)

    def visible_to(self, user: Requester | None) -> RunQuerySet:
        """What ``user`` may watch and read: their own runs, or every run (``may_view_all``)."""
        if self.may_view_all(user):
            return self.all()
        return self.for_owner(user)

    def cancellable_by(self, user: Requester | None) -> RunQuerySet:
        """What ``user`` may cancel: their own runs, or every run with ``change_run`` (what the
        admin's cancel action asks for)."""
        if has_model_permission(user, "change", self.model._meta):
            return self.all()
        return self.for_owner(user)

    def failed(self) -> RunQuerySet:
        """Failed with an error (exhausted runs have their own status and ``exhausted()``)."""
        return self.filter(status=self.model.Status.FAILED)

    def exhausted(self) -> RunQuerySet:
        """Stopped because the continuation budget ran out."""
        return self.filter(status=self.model.Status.EXHAUSTED)

    def recovered(self) -> RunQuerySet:
        """Runs where at least one continuation completed: recovery paid off."""
        event_model: Any = self.model._meta.get_field("events").related_model
        completed = event_model.objects.filter(run=OuterRef("pk"), name=LLM_STREAM_CONTINUATION_COMPLETED)
        return self.filter(Exists(completed))


class MessageQuerySet(models.QuerySet):
    def of_thread(self, thread_id: Any) -> MessageQuerySet:
        """A thread's committed messages, in order."""
        return self.filter(thread_id=thread_id).order_by("position")

    def canonical(self) -> list[dict[str, Any]]:
        """These messages in the ``{"role", "content"}`` shape the engine works with."""
        return [message.as_canonical() for message in self]


class AttemptQuerySet(models.QuerySet):
    def of_run(self, run_id: Any) -> AttemptQuerySet:
        """A run's provider calls, in order."""
        return self.filter(run_id=run_id).order_by("index")


class RecoveryEventQuerySet(models.QuerySet):
    def in_window(self, start: datetime, end: datetime | None = None) -> RecoveryEventQuerySet:
        """Events created in ``[start, end)``; no ``end`` means up to now and beyond."""
        qs = self.filter(created__gte=start)
        return qs.filter(created__lt=end) if end is not None else qs

    def named(self, *names: str) -> RecoveryEventQuerySet:
        """Events with any of these structured event names."""
        return self.filter(name__in=names)

    def for_model(self, provider: str, model: str | None = None) -> RecoveryEventQuerySet:
        qs = self.filter(provider=provider)
        return qs.filter(model=model) if model is not None else qs
