"""The demo project's URLs as a visitor meets them: the server's bare address leads to the demo chat."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_servers_address_alone_leads_to_the_chat_not_to_a_404() -> None:
    client = Client()
    response = client.get("/", follow=True)
    assert response.status_code == 200
    # not signed in: the chat sends the visitor on to the demo's login form
    assert response.redirect_chain[0] == (reverse("demo:chat"), 302)
    assert response.request["PATH_INFO"] == reverse("demo:login")
    assert b'name="password"' in response.content
