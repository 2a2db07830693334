"""Bounds on a model-planned run: model calls, tokens, tool calls, bad calls, and facts size.

A model can loop (call after call, or the same bad call again and again), and every turn costs
money and checkpoint space. :func:`exceeded` is asked before each model call; a reason means the
run must not call the model again (the engine ends the attempt with that reason). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from durable_agents.core.agent_facts import MAX_TURNS, AgentFacts
from durable_agents.core.digest import canonical_json

DEFAULT_MAX_FACTS_BYTES: Final = 96 * 1024
"""What the facts may take before the run stops calling the model: the room the largest status
leaves (tests/unit/test_limits.py), less the one turn that may cross it."""
MAX_AGENT_STEPS: Final = 63
"""Tool calls (so steps) a run may make at most: a scripted run's 64 steps, less its final answer,
so a model run's records outside its facts stay within the largest scripted status."""


@dataclass(frozen=True)
class AgentLimits:
    """The most a run may use. Defaults suit a small interactive task; raise them per policy."""

    max_model_calls: int = 64
    """Model calls per run, whatever they produced (a turn, a bad call, a final answer)."""
    max_model_calls_per_boundary: int = 4
    """Model calls between two checkpoint commits (a worker retrying bad calls in memory)."""
    max_tokens: int = 500_000
    """Input plus output tokens per run, as the model reported them."""
    max_tool_calls: int = 32
    """Tool calls per run (turns not refused: see :func:`tool_calls`)."""
    max_consecutive_tool_errors: int = 3
    """Bad calls in a row (unknown tool, invalid arguments) before the run gives up."""
    max_facts_bytes: int = DEFAULT_MAX_FACTS_BYTES
    """The agent facts' stored JSON, in bytes."""
    max_sub_agent_depth: int = 3
    """How deep sub-agent runs nest below a top-level run (a child of a top-level run: depth 1)."""
    max_sub_agents: int = 8
    """Sub-agent runs one run may start."""

    def __post_init__(self) -> None:
        for name in (
            "max_model_calls",
            "max_model_calls_per_boundary",
            "max_tokens",
            "max_tool_calls",
            "max_consecutive_tool_errors",
            "max_facts_bytes",
            "max_sub_agent_depth",
            "max_sub_agents",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_tool_calls > MAX_AGENT_STEPS:
            raise ValueError(
                f"max_tool_calls must be at most {MAX_AGENT_STEPS} (the steps a run's status holds)"
            )
        # Every turn comes from a model call: this keeps the facts within their type's MAX_TURNS.
        if self.max_model_calls > MAX_TURNS:
            raise ValueError(f"max_model_calls must be at most {MAX_TURNS} (the turns a checkpoint holds)")


def facts_bytes(facts: AgentFacts) -> int:
    """The size of the facts as the checkpoint stores them."""
    return len(canonical_json(facts.model_dump(mode="json", by_alias=True, exclude_none=True)))


def tool_calls(facts: AgentFacts) -> int:
    """Calls made or being made: refused turns (bad calls, or calls the policy or an approver
    refused) were never made, and are bounded by the model calls and tool errors instead."""
    return sum(1 for turn in facts.turns if turn.outcome != "refused")


def exceeded(facts: AgentFacts | None, limits: AgentLimits, *, calls_since_boundary: int) -> str | None:
    """Why the run may not call the model again, or None when it may."""
    if calls_since_boundary >= limits.max_model_calls_per_boundary:
        return (
            f"{calls_since_boundary} model calls since the last checkpoint: at most "
            f"{limits.max_model_calls_per_boundary} between two checkpoints"
        )
    if facts is None:
        return None
    if facts.model_calls_total >= limits.max_model_calls:
        return f"{facts.model_calls_total} model calls: the run's limit is {limits.max_model_calls}"
    if facts.usage_total.total >= limits.max_tokens:
        return (
            f"{facts.usage_total.total} tokens used ({facts.usage_total.input_tokens} in, "
            f"{facts.usage_total.output_tokens} out): the run's limit is {limits.max_tokens}"
        )
    calls = tool_calls(facts)
    if calls >= limits.max_tool_calls:
        return f"{calls} tool calls: the run's limit is {limits.max_tool_calls}"
    if facts.tool_errors >= limits.max_consecutive_tool_errors:
        return (
            f"{facts.tool_errors} invalid tool calls in a row: the model gives up after "
            f"{limits.max_consecutive_tool_errors}"
        )
    if len(facts.turns) >= MAX_TURNS:
        return f"{len(facts.turns)} turns: a checkpoint holds at most {MAX_TURNS}"
    size = facts_bytes(facts)
    if size > limits.max_facts_bytes:
        return f"the agent facts take {size} bytes: the run's limit is {limits.max_facts_bytes}"
    return None
