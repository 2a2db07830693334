"""What :func:`decide` is given: a read of the run, what the shell observed, and the settings."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import (
    ActionInput,
    ActionState,
    ActionTier,
    AgentPolicySpec,
    AgentRunSpec,
    AgentRunStatus,
    WaitExpiries,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.exchange import ModelReply
from durable_agents.core.checkpoint import KubernetesEvidenceRef, Loaded, Quarantine, load_checkpoint
from durable_agents.core.definitions import DefinitionNow, PinnedDefinition, pinned_of
from durable_agents.core.plan_guard import plan_digest
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION
from durable_agents.core.sealing import Keyring


def run_trace_id(run_id: str) -> str:
    """A trace ID for a run: 128 bits of a hash of its run ID (never all zeros, which is invalid)."""
    digest = hashlib.sha256(f"durable-agents/trace/{run_id}".encode()).hexdigest()[:32]
    return digest if int(digest, 16) else "1".rjust(32, "0")


def run_traceparent(trace_id: str) -> str:
    """The W3C traceparent of a run's trace root: its trace ID and a span ID derived from it, the
    same in every process (the remote parent each process's spans of the run hang off)."""
    span_id = hashlib.sha256(bytes.fromhex(trace_id)).hexdigest()[:16]
    return f"00-{trace_id}-{span_id if int(span_id, 16) else '1'.rjust(16, '0')}-01"


def creation_time(meta: Mapping[str, Any]) -> datetime | None:
    """An object's ``metadata.creationTimestamp``, or None when it has none (or not a time)."""
    value = meta.get("creationTimestamp")
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RunSnapshot:
    """One read of an AgentRun, as the engine needs it."""

    uid: str
    name: str
    namespace: str
    generation: int
    resource_version: str
    spec: AgentRunSpec
    status: AgentRunStatus
    raw_checkpoint: Mapping[str, Any] | None
    data_key: str | None = None
    """The run's wrapped data key (its sealed values' key: core/sealed_values.py), if it has one."""
    created_at: datetime | None = None
    """``metadata.creationTimestamp``: set by the API server, never by a client (whole seconds)."""
    definition: PinnedDefinition | None = None
    """A run of an Agent: the definition it pinned (or, before acceptance, is about to pin)."""
    agent_path: str | None = None
    """A sub-agent run: the Agents above it, as its parent wrote them (believed only with the
    stamp below: core/engine/subagents.py)."""
    agent_path_stamp: str | None = None
    stored_spec: AgentRunSpec | None = None
    """A run of an Agent: its spec as stored, before the pinned definition was put in ``spec``."""
    _memo: dict[str, tuple[object, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What was derived from this read once (the checkpoint validated, its stamp verified): a worker
    decides several times on one read (model turns, observations) and each load cost a whole
    validation and a canonical JSON of the checkpoint. ``replace`` starts a new one."""

    def memo(self, name: str, given: object, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per read and per ``given`` (compared by identity: a keyring)."""
        held = self._memo.get(name)
        if held is None or held[0] is not given:
            held = self._memo[name] = (given, compute())
        return held[1]

    @property
    def loaded(self) -> Loaded | Quarantine:
        """The stored checkpoint migrated and validated (never verified: see ``load_stored``)."""
        result: Loaded | Quarantine = self.memo("loaded", None, lambda: load_checkpoint(self.raw_checkpoint))
        return result

    @classmethod
    def from_object(
        cls, obj: Mapping[str, Any], *, prior: RunSnapshot | None = None, status: AgentRunStatus | None = None
    ) -> RunSnapshot:
        """``prior``: an earlier read sharing this one's spec object, unchanged (the worker's next
        transition shares its record's spec and replaces only the status): its validated spec is
        taken, not validated again. ``status``: the model ``obj``'s status was dumped from (the
        worker's own commit, :func:`durable_agents.core.engine.commits.committed_read`); otherwise
        the status is validated anew. The checkpoint is always read anew."""
        meta = obj["metadata"]
        raw_status = dict(obj.get("status") or {})
        raw_checkpoint = raw_status.pop("checkpoint", None)
        raw_spec = obj["spec"]
        held = prior._memo.get("spec") if prior is not None else None
        same = held is not None and held[0] is raw_spec
        spec = unpinned = held[1] if held is not None and same else AgentRunSpec.model_validate(raw_spec)
        pinned = pinned_of(raw_checkpoint) if spec.agent_ref else None
        annotations = meta.get("annotations") or {}
        if pinned is not None:  # a run of an Agent acts by the definition it pinned, only
            spec = spec.model_copy(update={"agent": pinned.agent_config()})
        read = cls(
            definition=pinned,
            uid=meta["uid"],
            name=meta["name"],
            namespace=meta["namespace"],
            generation=int(meta.get("generation", 1)),
            resource_version=meta["resourceVersion"],
            spec=spec,
            status=status if status is not None else AgentRunStatus.model_validate(raw_status),
            raw_checkpoint=raw_checkpoint,
            data_key=annotations.get(DATA_KEY_ANNOTATION),
            created_at=creation_time(meta),
            agent_path=annotations.get("durable-agents.io/agent-path"),
            agent_path_stamp=annotations.get("durable-agents.io/agent-path-stamp"),
            stored_spec=unpinned if pinned is not None else None,
        )
        read._memo["spec"] = (raw_spec, unpinned)
        if same and prior is not None and "plan" in prior._memo:  # digested from this spec already
            read._memo["plan"] = prior._memo["plan"]
        return read

    @property
    def as_created(self) -> AgentRunSpec:
        """The spec as stored, an Agent's definition not put in: what acceptance records."""
        return self.stored_spec or self.spec

    @property
    def plan(self) -> str:
        """:func:`durable_agents.core.plan_guard.plan_digest` of the spec as stored, once per spec."""
        digest: str = self.memo("plan", None, lambda: plan_digest(self.as_created))
        return digest

    def with_definition(self, pinned: PinnedDefinition) -> RunSnapshot:
        """This run of an Agent, before it pinned ``pinned``, as it will act once it has."""
        spec = self.spec.model_copy(update={"agent": pinned.agent_config()})
        return replace(self, spec=spec, definition=pinned, stored_spec=self.as_created)

    @property
    def pinned(self) -> PinnedDefinition | None:
        """The definition a run of an Agent pinned at acceptance (None before, or inline)."""
        return self.definition if self.raw_checkpoint is not None else None

    @property
    def state(self) -> RunState:
        return self.status.state

    @property
    def run_id(self) -> str:
        """The identity effects are keyed by: recorded at the first commit, so it survives a
        restore from backup (which gives the object a new uid); the uid until then."""
        return self.status.run_id or self.uid

    @property
    def trace_id(self) -> str:
        """The run's trace ID (32 lowercase hex): recorded at the first commit, derived from the
        run ID until then (the same in every process, so a unit before that commit agrees)."""
        return self.status.trace_id or run_trace_id(self.run_id)


@dataclass(frozen=True)
class ReadResult:
    """What the shell observed when it performed a read step."""

    step_index: int
    evidence: KubernetesEvidenceRef | None = None
    error_reason: str | None = None
    error_message: str = ""
    content: Mapping[str, Any] | None = None
    """The object read (for a model's read tool: its result, sealed into the turn)."""
    sampled_calls: int = 0
    """Model calls an MCP server's sampling made during the call (counted at the read's commit)."""
    sampled_input_tokens: int = 0
    sampled_output_tokens: int = 0


@dataclass(frozen=True)
class ModelAnswer:
    """What the shell got for a :class:`NeedModelTurn`: the reply to the request with this digest,
    or why there was none (``retryable``: the run's retry policy may call again)."""

    request_digest: str
    reply: ModelReply | None = None
    failure_reason: str = ""
    failure_message: str = ""
    retryable: bool = True


@dataclass(frozen=True)
class ActionObservation:
    """What the ledger says about one action: its dispatch state and authoritative outcome."""

    state: ActionState
    outcome: Mapping[str, Any] | None = None
    reason: str | None = None
    message: str | None = None
    input: ActionInput | None = None
    """The round of input the system asked for (``input_required``): the run asks its questions."""


@dataclass(frozen=True)
class ChildObservation:
    """A child run's state, as its record says."""

    state: RunState
    reason: str | None = None
    result: str | None = None
    """Its ``outcome.result`` (a sub-agent's sealed final answer), from a status whose stamp verified."""


@dataclass(frozen=True)
class Observations:
    """What the shell observed after an earlier decision asked for it, handed to :func:`decide` as
    one value. Each is ignored unless the run is at the point that needs it."""

    read: ReadResult | None = None
    """The result of a read step (:class:`NeedRead`, :class:`NeedToolCall` for a read tool)."""
    actions: Mapping[str, ActionObservation] | None = None
    """The ledger's action records, by name (:class:`NeedActions`)."""
    fresh_evidence: Mapping[str, KubernetesEvidenceRef | None] | None = None
    """Evidence read again before acting on an approval, by reference ID (:class:`NeedEvidence`)."""
    children: Mapping[str, ChildObservation] | None = None
    """Child runs' states, by name (:class:`NeedChildren`)."""
    model: ModelAnswer | None = None
    """The model's answer to the request asked for (:class:`NeedModelTurn`)."""


NOTHING_OBSERVED = Observations()
"""No observation: the first call for a run, before any request to the shell."""


@dataclass(frozen=True)
class Settings:
    """Policy inputs the engine needs; the shell resolves them from the AgentPolicy, if any."""

    wait_expiries: WaitExpiries = field(default_factory=WaitExpiries)
    policy_name: str | None = None
    policy_version: str | None = None
    policy_kind: str | None = None  # AgentPolicy or ClusterAgentPolicy (None: AgentPolicy)
    policy_digest: str | None = None  # the policy's content digest, recorded at acceptance
    # No policy resolved for the run (core/policy_resolution.py): only read-only actions; every
    # other is refused with PolicyRequired. False in pure tests that give no policy on purpose.
    policy_required: bool = False
    # Tier of each effect: the plugin's declared tier, overridden by the policy's.
    tiers: Mapping[str, ActionTier] = field(default_factory=dict)
    policy: AgentPolicySpec | None = None
    available_effects: frozenset[str] | None = None  # None: not checked
    operator_version: str | None = None  # None: deployment changes are not checked
    # Unseals checkpoints' sealed values; None: a checkpoint with any sealed value is quarantined.
    keyring: Keyring | None = None
    # An untimed createdBy stamp (an earlier release's) counts on a run created before this instant
    # (the operator's start); None: never (core/authority.py service_account_unproven).
    untimed_stamps_before: datetime | None = None
    # A run of an Agent not pinned yet: what it pins at acceptance, or why it cannot (it fails).
    definition: PinnedDefinition | None = None
    definition_refused: str | None = None
    # A pinned run's Agent as it is now (freshness.definitionChanged); None: not looked at.
    definition_now: DefinitionNow | None = None
