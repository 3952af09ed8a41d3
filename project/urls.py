"""Demo URLs: the admin, and the app's pages once ``streamrecover.urls`` exists."""

from __future__ import annotations

import importlib.util

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

if importlib.util.find_spec("streamrecover.urls") is not None:
    urlpatterns.append(path("streamrecover/", include("streamrecover.urls")))
