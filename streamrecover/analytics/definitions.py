"""The recovery figures, each defined once: key, label, unit and the text docs/analytics.md carries.

Also the names every other analytics module shares: the interruption causes and recovery plans
a breakdown counts, the additive figures (``SUMMED``) and the flat counters of ``AnalyticsRollup``
(``ROLLUP_COUNTERS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.errors import InterruptCause
from ..engine.plan import PlanKind


@dataclass(frozen=True, slots=True)
class Figure:
    """One reported figure: its key in every output, a label, a unit and what it counts."""

    key: str
    label: str
    unit: str  # count, ratio (a share, shown as %), average, seconds, bytes, tokens, breakdown
    definition: str


DEFINITIONS: tuple[Figure, ...] = (
    Figure(
        "runs",
        "Runs",
        "count",
        "Runs created in the window (the cohort). Every other figure counts these runs' attempts and "
        "events, whenever those happened.",
    ),
    Figure("attempts", "Attempts", "count", "Provider calls (`Attempt` rows) of the cohort's runs, of every kind."),
    Figure(
        "pre_stream_retries",
        "Pre-stream retries",
        "count",
        "Attempts of kind `pre_stream_retry`: a request sent again before its stream started (nothing generated).",
    ),
    Figure("interrupted_runs", "Interrupted runs", "count", "Runs with at least one `llm_stream_interrupted` event."),
    Figure("interruptions", "Interruptions", "count", "`llm_stream_interrupted` events (a run may break many times)."),
    Figure("interruption_rate", "Interruption rate", "ratio", "interrupted_runs / runs."),
    Figure(
        "interruptions_by_cause",
        "Interruptions by cause",
        "breakdown",
        "interruptions counted by the event's `cause` (connection_reset, idle_stall, goaway, "
        "provider_error_mid_stream, sse_parse, body_decode, unknown).",
    ),
    Figure(
        "interruptions_by_plan",
        "Interruptions by recovery plan",
        "breakdown",
        "interruptions counted by the event's `plan` (continue_text R1, synthesize_tool_use R2, "
        "truncate_before_tool R3, whole_restart R4, native_resume: the same response re-attached).",
    ),
    Figure(
        "recovered_runs",
        "Recovered runs",
        "count",
        "Interrupted runs that ended `completed` with at least one `llm_stream_continuation_completed` event.",
    ),
    Figure(
        "exhausted_runs",
        "Exhausted runs",
        "count",
        "Interrupted runs that ended `exhausted` (the continuation budget ran out).",
    ),
    Figure(
        "failed_runs",
        "Failed runs",
        "count",
        "Interrupted runs that ended `failed` (e.g. a permanent error after the break).",
    ),
    Figure(
        "recovery_rate",
        "Recovery rate",
        "ratio",
        "recovered_runs / interrupted_runs (interrupted runs still going, or cancelled, count as not recovered).",
    ),
    Figure(
        "recoveries",
        "Recoveries",
        "count",
        "`llm_stream_continuation_completed` events: turns that a recovery brought to their end.",
    ),
    Figure(
        "continuations_per_recovered_run",
        "Continuation attempts per recovered run",
        "average",
        "Sum of `continuation_attempt` of the recovered runs' `llm_stream_continuation_completed` events "
        "(the continuation attempts each recovery took; an R2 recovery may take none) / recovered_runs.",
    ),
    Figure(
        "time_to_recover_p50_s",
        "Time to recover, p50",
        "seconds",
        "Median, over recoveries, of the seconds from the first `llm_stream_interrupted` of the same run and "
        "turn to the `llm_stream_continuation_completed` event (for a run recovered once: first interruption "
        "to the run's completion event). Continuous percentile (`percentile_cont`).",
    ),
    Figure(
        "time_to_recover_p95_s",
        "Time to recover, p95",
        "seconds",
        "95th percentile of the same durations, interpolated the same way.",
    ),
    Figure(
        "discarded_tool_uses",
        "Discarded partial tool calls",
        "count",
        "`discarded_partial_tool_use` events: tool calls whose arguments never completed.",
    ),
    Figure(
        "partial_tool_use_incidence",
        "Partial tool-call incidence",
        "ratio",
        "discarded_tool_uses / interruptions.",
    ),
    Figure(
        "discarded_tool_bytes",
        "Discarded tool-call bytes",
        "bytes",
        "Sum of `partial_input_bytes` of the `discarded_partial_tool_use` events.",
    ),
    Figure(
        "discarded_thinking_blocks",
        "Discarded thinking blocks",
        "count",
        "`discarded_thinking` events: thinking that could not go back into history.",
    ),
    Figure(
        "discarded_thinking_bytes",
        "Discarded thinking bytes",
        "bytes",
        "Sum of `partial_bytes` of the `discarded_thinking` events.",
    ),
    Figure(
        "output_tokens_billed",
        "Output tokens billed",
        "tokens",
        "Sum of `output_tokens` over all attempts, broken ones included; a broken attempt whose final usage "
        "never came counts the engine's upper bound on what it streamed (`Attempt.usage_estimated`).",
    ),
    Figure(
        "output_tokens_delivered",
        "Output tokens delivered",
        "tokens",
        "Sum of `output_tokens` of completed attempts, plus for each recovery the "
        "`kept_output_tokens_estimate` of the last interruption of its turn (the salvaged output that "
        "became part of the answer; the estimate is cumulative within a turn, so the last one counts it once).",
    ),
    Figure(
        "tokens_saved",
        "Output tokens saved vs. a naive restart",
        "tokens",
        "Sum of `kept_output_tokens_estimate` of the interruptions recovered by a plan other than "
        "`whole_restart`; an interruption is recovered when its run and turn has a "
        "`llm_stream_continuation_completed` event. The output a restart would have generated and paid again.",
    ),
    Figure(
        "continuation_input_tokens",
        "Input tokens of continuations",
        "tokens",
        "Sum of `input_tokens` of `continuation` and `resume` attempts: what continuing cost instead "
        "(the kept prefix is sent as input). Cached input tokens count too, for every provider. A broken "
        "attempt that reported no input counts the UTF-8 bytes of its request's text instead "
        "(`Attempt.usage_estimated`).",
    ),
)

FIGURES: dict[str, Figure] = {f.key: f for f in DEFINITIONS}
CAUSES: tuple[str, ...] = tuple(c.value for c in InterruptCause)
PLANS: tuple[str, ...] = tuple(p.value for p in PlanKind)
SERIES_FIELDS: tuple[str, ...] = ("runs", "interrupted_runs", "recovered_runs")

OTHER = "other"
SUMMED = (
    "runs",
    "attempts",
    "pre_stream_retries",
    "interrupted_runs",
    "interruptions",
    "recovered_runs",
    "exhausted_runs",
    "failed_runs",
    "recoveries",
    "continuations_in_recovered",
    "discarded_tool_uses",
    "discarded_tool_bytes",
    "discarded_thinking_blocks",
    "discarded_thinking_bytes",
    "output_tokens_billed",
    "completed_output_tokens",
    "kept_tokens_delivered",
    "tokens_saved",
    "continuation_input_tokens",
)
BREAKDOWNS = (("cause", CAUSES, "interruptions_by_cause"), ("plan", PLANS, "interruptions_by_plan"))
# The additive figures with the breakdowns flat (``cause_goaway``): the columns of ``AnalyticsRollup``.
ROLLUP_COUNTERS: tuple[str, ...] = (
    *SUMMED,
    *(f"{field}_{value}" for field, values, _ in BREAKDOWNS for value in (*values, OTHER)),
)


def definitions_markdown() -> str:
    """The definitions table as markdown (docs/analytics.md carries it)."""
    lines = ["| figure | key | unit | definition |", "|---|---|---|---|"]
    lines += [f"| {f.label} | `{f.key}` | {f.unit} | {f.definition} |" for f in DEFINITIONS]
    return "\n".join(lines) + "\n"
