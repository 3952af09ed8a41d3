"""What the harness asks for: the runs (prompt, provider, tools, thinking) and the fault script.

Both come from one seed, so a failing figure can be reproduced with ``--seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

TOPICS = ["harbours", "lighthouses", "glaciers", "bridges", "orchards", "comets", "ferries", "libraries"]


@dataclass(frozen=True)
class RunSpec:
    """One run the harness starts through the API."""

    index: int
    tag: str  # unique in the prompt: the fake provider's log is matched to runs by it
    prompt: str
    provider: str  # "fake" (Anthropic wire) or "fake-openai"
    model: str
    tools: bool
    thinking_budget: int | None
    max_tokens: int = 2048

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": self.prompt, "provider": self.provider, "model": self.model,
            "demo_tools": self.tools, "max_tokens": self.max_tokens,
        }  # fmt: skip
        if self.thinking_budget is not None:
            body["thinking_budget"] = self.thinking_budget
        return body


@dataclass
class Plan:
    runs: list[RunSpec]
    faults: list[str] = field(default_factory=list)


def make_plan(runs: int, seed: int, fault_rate: float, tools_every: int = 4) -> Plan:
    rng = random.Random(seed)
    specs = []
    for index in range(runs):
        openai = index % 2 == 1
        tools = tools_every > 0 and index % tools_every == 0
        thinking = not openai and not tools and index % 5 == 2
        words = rng.randint(60, 220)
        tag = f"chaos-{seed}-{index:04d}"
        prompt = f"Run {tag}: tell me about {rng.choice(TOPICS)} [[words={words}]]"
        if tools:
            prompt += " [[tool]]"
        specs.append(
            RunSpec(
                index=index,
                tag=tag,
                prompt=prompt,
                provider="fake-openai" if openai else "fake",
                model="fake-gpt" if openai else "fake-claude",
                tools=tools,
                thinking_budget=1024 if thinking else None,
                max_tokens=4096 if thinking else 2048,
            )
        )
    # Enough for every run's calls several times over; past its end requests succeed.
    faults = [_fault(rng) if rng.random() < fault_rate else "ok" for _ in range(runs * 8)]
    return Plan(specs, faults)


def _fault(rng: random.Random) -> str:
    events = rng.randint(4, 80)
    return rng.choice(
        [
            f"cut:events={events}",
            f"cut:events={events},mid",
            f"cut:bytes={rng.randint(200, 4000)}",
            f"error:events={events},type=overloaded_error,message=Overloaded",
            f"stall:events={events},seconds=3",
            "status:529,retry_after=0.5,type=overloaded_error,message=Overloaded",
            "status:429,retry_after_ms=300,type=rate_limit_error,message=Slow down",
            f"goaway:events={events}",
            f"eof:events={events}",
            "drop",
        ]
    )
