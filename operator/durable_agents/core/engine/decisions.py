"""What :func:`decide` answers: wait, ask the shell for something, or commit the next status."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec, AgentRunStatus, ObjectReference
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.agent.mcp_sampling import SamplingAllowance
from durable_agents.core.checkpoint import Checkpoint, KubernetesEvidenceRef
from durable_agents.core.planner import ReadTool
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import RunEvent


@dataclass(frozen=True)
class NeedActions:
    """The run waits on these actions: make sure each record exists, then report its state.

    ``cancel``: cancel each one still undispatched (``intent``) first; a dispatched one is reconciled.
    """

    records: dict[str, ActionRecordSpec | None]
    cancel: bool = False


@dataclass(frozen=True)
class NeedChildren:
    """The run waits on these child runs: create any missing one (from its body), report each state.

    ``cancel``: ask each one not yet terminal to cancel (task scope), with this reason.
    """

    records: dict[str, dict[str, Any] | None]
    cancel: str | None = None


@dataclass(frozen=True)
class NeedEvidence:
    """Re-read these evidence references (as the run's ServiceAccount) before acting on approval."""

    refs: tuple[KubernetesEvidenceRef, ...]


@dataclass(frozen=True)
class Idle:
    wake_at: datetime | None = None
    reason: str = ""


@dataclass(frozen=True)
class NeedRead:
    step_index: int
    step_name: str
    ref: ObjectReference


@dataclass(frozen=True)
class NeedToolCall:
    """A read-only MCP tool call to perform first (the shell calls back with its result as a
    :class:`~durable_agents.core.engine.snapshot.ReadResult`). Not a transition: repeated after a
    crash, like a read."""

    step_index: int
    step: ReadTool
    sampling: SamplingAllowance | None = None
    """What the call's server may sample of the run's model (None: no grant, every request refused)."""


@dataclass(frozen=True)
class NeedModelTurn:
    """The model planner's next call: the shell sends ``request`` and calls back with the answer.
    Not a transition: a crash before the next commit repeats the call, never an effect."""

    request: ModelRequest
    step_index: int


@dataclass(frozen=True)
class Commit:
    event: RunEvent
    status: AgentRunStatus
    checkpoint: dict[str, Any] | None
    detail: str = ""
    intents: tuple[ActionRecordSpec, ...] = ()  # action records to create right after this commit
    children: tuple[dict[str, Any], ...] = ()  # child runs to create right after this commit
    migrated_from: int | None = None  # the checkpoint was read from this older schema version
    # The checkpoint as the model it was dumped from, and the keyring that stamped it: the worker's
    # next decision in the same unit starts from it without reading its own output back.
    stamped: Checkpoint | None = field(default=None, compare=False, repr=False)
    stamped_by: Keyring | None = field(default=None, compare=False, repr=False)

    @property
    def state(self) -> RunState:
        return self.status.state

    def wire_status(self) -> dict[str, Any]:
        out = self.status.wire()
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        return out


Decision = Idle | NeedRead | NeedActions | NeedEvidence | NeedChildren | NeedModelTurn | NeedToolCall | Commit
