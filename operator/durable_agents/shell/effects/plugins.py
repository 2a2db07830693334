"""Plugins found through entry points: effects and planners. Built-ins win on a name clash.

A third-party package adds an effect under the group ``durable_agents.effects`` (a callable
returning an :class:`~durable_agents.shell.effects.Effect`) and a planner under
``durable_agents.planners`` (a callable returning a :class:`~durable_agents.core.planner.Planner`).
"""

from __future__ import annotations

from importlib.metadata import entry_points

from durable_agents.core.planner import BUILTIN, Planner
from durable_agents.shell.effects import Effect
from durable_agents.shell.effects.http import HttpPost
from durable_agents.shell.effects.kubernetes import KubernetesApply
from durable_agents.shell.effects.mcp import McpCall

EFFECTS_GROUP = "durable_agents.effects"
PLANNERS_GROUP = "durable_agents.planners"


def load_effects() -> dict[str, Effect]:
    """Built-in effects plus entry-point plugins."""
    builtin: dict[str, Effect] = {e.name: e for e in (HttpPost(), KubernetesApply(), McpCall())}
    found: dict[str, Effect] = {}
    for ep in entry_points(group=EFFECTS_GROUP):
        effect = ep.load()()
        found[effect.name] = effect
    return {**found, **builtin}


def load_planners() -> dict[str, Planner]:
    """Built-in planners plus entry-point plugins."""
    found: dict[str, Planner] = {}
    for ep in entry_points(group=PLANNERS_GROUP):
        found[ep.name] = ep.load()()
    return {**found, **BUILTIN}
