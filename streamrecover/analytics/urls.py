"""The analytics page and its JSON twin, for a host project that opts in.

Include it beside the app's API, e.g. ``path("streamrecover/", include("streamrecover.analytics.urls"))``;
the admin's "Recovery analytics" entry links to it once it is included.
"""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "streamrecover_analytics"

urlpatterns = [
    path("analytics/", views.analytics_page, name="page"),
    path("analytics.json", views.analytics_json, name="json"),
]
