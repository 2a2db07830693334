"""What a decision asks the shell to look at before the engine decides again.

The engine answers :class:`NeedRead`, :class:`NeedActions`, :class:`NeedChildren`,
:class:`NeedEvidence` or :class:`NeedToolCall` when a step needs something only the shell can
observe: a Kubernetes read, the ledger's action records, child runs, evidence read again before
acting on an approval, a read-only tool's answer. :class:`Observers` performs it and hands back
the run's :class:`Observations` with that part filled in; the worker calls ``decide`` again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from durable_agents.core.engine import (
    Decision,
    NeedActions,
    NeedChildren,
    NeedEvidence,
    NeedRead,
    NeedToolCall,
    Observations,
    RunSnapshot,
    Settings,
)
from durable_agents.shell.agent.model_turns import ModelTurns
from durable_agents.shell.agent.tool_calls import call_read_tool, refused_destination
from durable_agents.shell.ledger.actions import ActionStore
from durable_agents.shell.runs.children import ChildRuns
from durable_agents.shell.runs.evidence import EvidenceReader


@dataclass(frozen=True)
class Observers:
    """Where the shell looks: Kubernetes evidence, the action ledger, child runs."""

    reader: EvidenceReader
    actions: ActionStore
    children: ChildRuns
    models: ModelTurns | None = None
    """The run's model, for what an MCP server samples during a read-only call."""

    async def records(self, run: RunSnapshot, decision: Decision, seen: Observations) -> Observations | None:
        """``seen`` with the action records or child runs ``decision`` asks for; None when it asks
        for neither. Looking at them needs no Lease: only a commit does."""
        if isinstance(decision, NeedActions):
            return replace(seen, actions=await self.actions.observe(run, decision))
        if isinstance(decision, NeedChildren):
            return replace(seen, children=await self.children.observe(run, decision))
        return None

    async def observe(
        self,
        run: RunSnapshot,
        decision: Decision,
        now: datetime,
        seen: Observations,
        settings: Settings | None = None,
    ) -> Observations | None:
        """``seen`` with whatever ``decision`` asks to be observed; None when it asks for nothing
        observed here (a model turn, an idle, a commit)."""
        if isinstance(decision, NeedRead):
            return replace(seen, read=await self.reader.read(run, decision, now))
        if isinstance(decision, NeedEvidence):
            fresh = {ref.id: await self.reader.reread(run, ref, now) for ref in decision.refs}
            return replace(seen, fresh_evidence=fresh)
        if isinstance(decision, NeedToolCall):  # its server: the policy's allowlist, now
            refused = refused_destination(run, decision, settings)
            if refused is not None:
                return replace(seen, read=refused)
            read = await call_read_tool(run, decision, kube=self.reader.kube, models=self.models)
            return replace(seen, read=read)
        return await self.records(run, decision, seen)


def sampled_calls(before: Observations, after: Observations) -> int:
    """The model calls an MCP server's sampling made during a read just observed (0 for others):
    the worker bounds them with its own between two commits (a crash repeats both)."""
    read = after.read
    return read.sampled_calls if read is not None and read is not before.read else 0
