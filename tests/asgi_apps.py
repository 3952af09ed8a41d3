"""ASGI applications routed the ways a host project might, for the W006 check's tests."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.core.asgi import get_asgi_application
from django.urls import path

from streamrecover.live.consumer import RunConsumer
from streamrecover.routing import websocket_urlpatterns

http = get_asgi_application()

# As the README says: the origin check around the auth stack.
checked = ProtocolTypeRouter(
    {"http": http, "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))}
)
# As the README used to say: inside AuthMiddlewareStack, nothing else (cross-site WebSocket hijacking).
unchecked = ProtocolTypeRouter({"http": http, "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns))})
# Nested routers, a subclass of the consumer, the check around only the other route.
other = URLRouter([path("ws/other/", RunConsumer.as_asgi())])


class HostConsumer(RunConsumer):
    """A host's own subclass."""


nested_unchecked = ProtocolTypeRouter(
    {
        "websocket": URLRouter(
            [
                path("a/", AllowedHostsOriginValidator(other)),
                path("b/", AuthMiddlewareStack(URLRouter([path("runs/<uuid:run_id>/", HostConsumer.as_asgi())]))),
            ]
        )
    }
)
nested_checked = AllowedHostsOriginValidator(
    URLRouter([path("b/", AuthMiddlewareStack(URLRouter([path("runs/<uuid:run_id>/", HostConsumer.as_asgi())])))])
)
# No WebSocket at all, and a wrapper that hides what it wraps: nothing can be seen, nothing is said.
http_only = ProtocolTypeRouter({"http": http})


def _closure(app: Any) -> Any:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)

    return wrapped


opaque = ProtocolTypeRouter({"websocket": _closure(URLRouter(websocket_urlpatterns))})
