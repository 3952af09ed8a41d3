"""A host project that includes only ``streamrecover.urls`` gets the JSON API: no chat, no login page,
no analytics page (it opts into that one), and no admin entry pointing at a page it lacks."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client, override_settings
from django.urls import NoReverseMatch, include, path, reverse

from .factories import make_thread, make_user

pytestmark = pytest.mark.django_db

urlpatterns = [
    path("admin/", admin.site.urls),
    path("streamrecover/", include("streamrecover.urls")),
]

HOST = override_settings(ROOT_URLCONF=__name__)


@HOST
def test_the_api_is_there() -> None:
    user = make_user()
    thread = make_thread(owner=user, title="mine")
    client = Client()
    client.force_login(user)
    assert reverse("streamrecover:api-threads") == "/streamrecover/api/threads/"
    listing = client.get(reverse("streamrecover:api-threads"))
    assert listing.status_code == 200
    assert [t["id"] for t in listing.json()["threads"]] == [thread.pk]
    assert client.get(reverse("streamrecover:api-thread", args=[thread.pk])).status_code == 200


@HOST
@pytest.mark.parametrize("name", ["demo:chat", "demo:login", "demo:logout", "streamrecover_analytics:page"])
def test_no_demo_and_no_analytics_names(name: str) -> None:
    with pytest.raises(NoReverseMatch):
        reverse(name)


@HOST
@pytest.mark.parametrize(
    "url", ["/streamrecover/", "/streamrecover/login/", "/streamrecover/analytics/", "/streamrecover/analytics.json"]
)
def test_no_chat_login_or_analytics_page(url: str) -> None:
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    assert client.get(url).status_code == 404


@HOST
def test_the_admin_lists_no_analytics_entry_without_the_page() -> None:
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "Recovery analytics" not in index.content.decode()
    assert "Runs" in index.content.decode()  # the app itself is listed
