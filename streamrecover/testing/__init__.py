"""Testing and demo tools: the fault-injecting fake provider, the reference client, sample tools.

The rest of the app reaches the fake only through the functions below: ``is_fake`` (is this
config the built-in ``fake://`` provider?), ``parse_faults`` (validate fault specs) and
``fake_provider`` (a config pointed at this process's fake server, with a fault script),
``fake_adapter`` (the wire format such a config speaks for a model);
``fake_server`` builds a standalone one (``manage.py streamrecover_fake_provider``);
``demo_registry`` gives the sample tools a run asks for with ``demo_tools`` (``demo_tools_for_run``,
the default ``STREAMRECOVER['TOOLS']``, gives them to such a run); ``ChaosProxy``
forwards to a real provider and breaks its streams (``manage.py streamrecover_chaos_proxy``).
Testing a host project: ``streamrecover.testing.host`` and its pytest plugin, which import
Django's ORM and so are not imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..engine.contract import ProviderConfig
from .chaos import ChaosProxy
from .fake import DEFAULT_SCENARIO, SCENARIO_HEADER, FakeProviderServer, Fault, parse_script
from .fake.local import FAKE_SCHEME, fake_adapter, local_fake_server, materialize
from .tools import demo_registry, demo_tools_for_run

__all__ = [
    "DEFAULT_SCENARIO",
    "ChaosProxy",
    "FakeProviderServer",
    "demo_registry",
    "demo_tools_for_run",
    "fake_adapter",
    "fake_provider",
    "fake_server",
    "is_fake",
    "parse_faults",
]


def is_fake(config: ProviderConfig) -> bool:
    """Whether ``config`` names the built-in fake provider (a ``fake://`` base URL)."""
    return config.base_url.startswith(FAKE_SCHEME)


def parse_faults(specs: Sequence[str]) -> list[Fault]:
    """Fault specs (``cut:bytes=1500``...) parsed; a ``ValueError`` naming the first bad one."""
    faults = []
    for spec in specs:
        try:
            faults.append(Fault.parse(spec))
        except ValueError as exc:
            raise ValueError(f"Bad fault {spec!r}: {exc}") from None
    return faults


def fake_provider(
    config: ProviderConfig, model: str, *, scenario: str | None = None, faults: Sequence[str] = ()
) -> ProviderConfig:
    """``config`` with its ``fake://`` base URL replaced by this process's fake server (started
    on first use) in ``model``'s wire format; ``faults`` are scripted for ``scenario``, which
    the returned config's requests name in a header. Any other config comes back as it is."""
    if not is_fake(config):
        return config
    if faults:
        if not scenario:
            raise ValueError("faults need a scenario to be scripted for")
        local_fake_server().set_faults(scenario, parse_faults(faults))
        config = replace(config, extra_headers={**config.extra_headers, SCENARIO_HEADER: scenario})
    return materialize(config, model)


def fake_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    event_delay: float = 0.0,
    script: str = "",
    scenario: str = DEFAULT_SCENARIO,
) -> FakeProviderServer:
    """A fake provider on ``host:port`` (not started yet), with ``script``'s faults
    (``"cut:bytes=900;ok"``) for ``scenario``; a bad script is a ``ValueError``."""
    faults = parse_script(script)
    server = FakeProviderServer(host, port, event_delay=event_delay)
    if faults:
        server.set_faults(scenario, faults)
    return server
