"""ASGI entry point (Daphne): HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

# Set up Django (apps, settings) before anything that imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from streamrecover.gctuning import tune_collector  # noqa: E402
from streamrecover.routing import websocket_urlpatterns  # noqa: E402


def _plain_autobahn_debug_text() -> None:
    """Autobahn builds the arguments of a debug log line on every WebSocket send, whatever the
    log level, and colours them with click when click is installed (Celery brings it): about
    a tenth of Daphne's CPU per frame. Without click it uses the text as it is."""
    try:
        import autobahn.util
    except ImportError:
        return
    autobahn.util._HAS_CLICK = False  # only the colours of debug lines change


_plain_autobahn_debug_text()


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything Daphne serves with is loaded: keep it out of the collector's full passes, which
# stopped every socket of the process for up to 290 ms at 500 streams (GC_THRESHOLD).
tune_collector()
