"""Plugins found through entry points: third-party effects and planners join, built-ins win."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from durable_agents.api.v1alpha1 import ActionTier
from durable_agents.core.planner import BUILTIN, Finish, PlanningContext
from durable_agents.shell.effects import Action, Applied, EffectContext, NotApplied, plugins
from durable_agents.shell.effects.plugins import PLANNERS_GROUP, load_effects, load_planners

pytestmark = pytest.mark.unit


class _Ticket:
    name = "ticket.open"
    tier = ActionTier.REVERSIBLE
    reversible = True
    compensation: str | None = "ticket.close"

    async def dispatch(self, ctx: EffectContext, action: Action) -> Applied:
        return Applied({"ticket": action.key})

    async def query(self, ctx: EffectContext, action: Action) -> NotApplied:
        return NotApplied()


class _EntryPoint:
    def __init__(self, name: str, factory: Any) -> None:
        self.name = name
        self._factory = factory

    def load(self) -> Any:
        return self._factory


def test_third_party_effects_register_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_entry_points(*, group: str) -> list[_EntryPoint]:
        assert group == "durable_agents.effects"
        return [_EntryPoint("ticket.open", _Ticket), _EntryPoint("http.post", _Ticket)]

    monkeypatch.setattr(plugins, "entry_points", fake_entry_points)
    loaded = load_effects()
    assert isinstance(loaded["ticket.open"], _Ticket)
    assert loaded["ticket.open"].tier is ActionTier.REVERSIBLE
    # A plugin cannot replace a built-in effect.
    assert type(loaded["http.post"]).__name__ == "HttpPost"
    assert loaded["kubernetes.apply"].reversible


def test_load_planners_adds_entry_points_and_builtins_win(monkeypatch: pytest.MonkeyPatch) -> None:
    class Other:
        name = "other"

        def next_step(self, context: PlanningContext) -> Finish:
            return Finish("other", "")

    class Impostor(Other):
        name = "scripted"

    seen_groups: list[str] = []

    def fake_entry_points(*, group: str) -> list[SimpleNamespace]:
        seen_groups.append(group)
        return [
            SimpleNamespace(name="other", load=lambda: Other),
            SimpleNamespace(name="scripted", load=lambda: Impostor),
        ]

    monkeypatch.setattr(plugins, "entry_points", fake_entry_points)
    planners = load_planners()
    assert seen_groups == [PLANNERS_GROUP]
    assert set(planners) == {"scripted", "other"}
    assert planners["scripted"] is BUILTIN["scripted"]
    assert isinstance(planners["other"], Other)


def test_load_planners_without_plugins_is_the_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "entry_points", lambda *, group: [])
    assert load_planners() == BUILTIN
