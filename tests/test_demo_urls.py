"""The demo project's URLs as a visitor meets them: the bare address leads to the chat, the staff pages back to it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from .factories import make_user

pytestmark = pytest.mark.django_db


def test_the_servers_address_alone_leads_to_the_chat_not_to_a_404() -> None:
    client = Client()
    response = client.get("/", follow=True)
    assert response.status_code == 200
    # not signed in: the chat sends the visitor on to the demo's login form
    assert response.redirect_chain[0] == (reverse("demo:chat"), 302)
    assert response.request["PATH_INFO"] == reverse("demo:login")
    assert b'name="password"' in response.content


def test_a_signed_in_visitor_who_is_not_staff_is_told_why_the_analytics_page_is_closed_and_led_back() -> None:
    client = Client()
    client.force_login(make_user(username="visitor"))
    response = client.get(reverse("streamrecover_analytics:page"))
    assert response.status_code == 403
    page = response.content.decode()
    assert "Staff only." in page  # was a bare "403 Forbidden"
    assert "createsuperuser" in page
    assert f'href="{reverse("demo:chat")}"' in page


def test_the_analytics_page_leads_back_to_the_demo_chat() -> None:
    client = Client()
    client.force_login(make_user(username="boss", is_staff=True))
    response = client.get(reverse("streamrecover_analytics:page"))
    assert response.status_code == 200
    assert f'<a href="{reverse("demo:chat")}">Chat</a>' in response.content.decode()
