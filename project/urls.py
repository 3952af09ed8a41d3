"""Demo URLs: the admin, the app's JSON API, the analytics page it opts into, the demo chat and the healing endpoint."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("streamrecover/", include("streamrecover.urls")),
    path("streamrecover/", include("streamrecover.analytics.urls")),
    path("streamrecover/", include("project.demo.urls")),
    path("streamrecover/proxy/", include("streamrecover.proxy.urls")),
]
