"""Demo URLs: the admin, the app's JSON API, the analytics page it opts into, the demo chat and the healing endpoint."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    # the server's address alone (what a visitor types, what Daphne prints) leads to the demo chat
    path("", RedirectView.as_view(pattern_name="demo:chat", permanent=False)),
    path("admin/", admin.site.urls),
    path("streamrecover/", include("streamrecover.urls")),
    path("streamrecover/", include("streamrecover.analytics.urls")),
    path("streamrecover/", include("project.demo.urls")),
    path("streamrecover/proxy/", include("streamrecover.proxy.urls")),
]
