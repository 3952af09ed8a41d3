"""Tools offered by the demo and the command line's ``--demo-tools``: deterministic, local."""

from __future__ import annotations

import hashlib
from typing import Any

from ..engine.agent import Tool, ToolRegistry


def get_weather(args: dict[str, Any]) -> dict[str, Any]:
    """The weather for a city (made up, but the same city always gets the same weather)."""
    city = str(args.get("city") or args.get("location") or "nowhere")
    digest = hashlib.sha256(city.lower().encode()).digest()
    conditions = ["sunny", "cloudy", "rainy", "windy", "snowy"][digest[0] % 5]
    return {"city": city, "conditions": conditions, "temperature_c": digest[1] % 35 - 5}


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}


def demo_registry() -> ToolRegistry:
    return ToolRegistry([Tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA, get_weather)])


def demo_tools_for_run(run: Any) -> ToolRegistry | None:
    """The default ``STREAMRECOVER['TOOLS']``: the sample tools for a run created with
    ``demo_tools``, none for any other (a host's own function may fall back on this one)."""
    return demo_registry() if run.options.get("demo_tools") else None
