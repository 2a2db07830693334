"""Builders shared by the engine's unit tests: AgentRun records, settings, a clock, and helpers
that drive :func:`decide` and check what it commits.

No cluster: an AgentRun is a plain dict shaped like the API server's answer, and :func:`apply`
stands in for the store (it writes a commit's status and bumps the resourceVersion).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import (
    ActionRecordSpec,
    ActionTier,
    AgentPolicySpec,
    AgentRunStatus,
    ApprovalDecision,
    CancelRequest,
    Condition,
    ControlRequest,
    Identity,
)
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.authority import stamp_cancellation, stamp_creator, stamp_decision, stamp_retry
from durable_agents.core.checkpoint import Checkpoint, Fencing, KubernetesEvidenceRef, Loaded, load_checkpoint
from durable_agents.core.digest import canonical_digest
from durable_agents.core.engine import (
    ActionObservation,
    ChildObservation,
    Commit,
    Decision,
    Idle,
    NeedRead,
    Observations,
    ReadResult,
    RunSnapshot,
    Settings,
    decide,
)
from durable_agents.core.ledger import action_record_name
from durable_agents.core.planner import ScriptedPlanner
from durable_agents.core.sealing import Keyring
from durable_agents.core.statemachine import TRANSITIONS, RunEvent

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

# The operator's keys in the engine's tests: what stamps the runs' ServiceAccounts (new_run), and
# what a test's Settings(keyring=...) verifies them with.
KEYRING = Keyring(keys={"k2030": bytes(range(32))}, active_key_id="k2030")
CREATOR = Identity(username="alice", groups=["editors"])
CREATED = T0  # metadata.creationTimestamp, and when the webhook stamped createdBy

EPOCH = Fencing(holder="worker-a", lease_transitions=3)

PLANNER = ScriptedPlanner()

SETTINGS = Settings(policy_name="default-policy", policy_version="v7")

AGENT = {"model": "model-2030-01", "prompt": "prompt-v3", "toolSet": "read-only-v1"}

RUN = "run-1"

DONE: dict[str, Any] = {"name": "done", "complete": {"result": "ok"}}

READ: dict[str, Any] = {
    "name": "read-settings",
    "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings"}},
}

CHILD: dict[str, Any] = {
    "name": "sub",
    "child": {"taskType": "t", "objective": "o", "steps": [{"name": "c", "complete": {}}]},
}

NOT_FOUND = 'configmaps "settings" not found'

QUARANTINE_IDLE = "quarantined: retry (spec.retryQuarantine) or cancel"

FUTURE_CHECKPOINT: dict[str, Any] = {
    "schemaVersion": 99,
    "position": {"state": "ready", "step": 3, "stateVersion": 1},
    "fencing": {"holder": "worker-from-the-future", "leaseTransitions": 12},
    "hologram": {"layers": [{"depth": 1, "ids": ["a", "b"]}, {"depth": 2, "ids": []}]},
}


# --- clocks --------------------------------------------------------------------------------------


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


# --- AgentRun records, as the API server returns them --------------------------------------------


def new_run(**spec: Any) -> dict[str, Any]:
    """An AgentRun as the API server returns it right after creation (no status yet), created
    through the admission webhook: ``createdBy`` carries the stamp of :data:`KEYRING` that lets the
    run act as its ServiceAccount (pass ``createdBy`` to say otherwise, ``None`` for none)."""
    body: dict[str, Any] = {"taskType": "unit", "objective": "exercise the engine", **spec}
    if "createdBy" not in body:
        sa = body.get("serviceAccountName", "default")
        body["createdBy"] = stamp_creator(KEYRING, "team-a", "run-1", sa, CREATOR, CREATED)
    elif body["createdBy"] is None:
        del body["createdBy"]
    return {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "uid": "5f0b6c1e-0000-4000-8000-000000000001",
            "name": "run-1",
            "namespace": "team-a",
            "generation": 1,
            "resourceVersion": "100",
            "creationTimestamp": iso(CREATED),
        },
        "spec": body,
    }


UID: str = new_run()["metadata"]["uid"]


def snap(obj: dict[str, Any]) -> RunSnapshot:
    return RunSnapshot.from_object(obj)


def run_in(state: RunState, **spec: Any) -> dict[str, Any]:
    """An accepted run whose record has been moved to ``state`` (the engine trusts status.state)."""
    obj = apply(new_run(**spec), commit_of(step(new_run(**spec), T0)))
    obj["status"]["state"] = state.value
    obj["status"]["checkpoint"]["position"]["state"] = state.value
    return obj


def apply(obj: dict[str, Any], commit: Commit) -> dict[str, Any]:
    """What the store does with a commit: one write of the whole status, a new resourceVersion."""
    out = copy.deepcopy(obj)
    out["status"] = copy.deepcopy(commit.wire_status())
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def apply_status(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"] = copy.deepcopy(status)
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def patch_spec(obj: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A user's patch of the spec: the API server bumps generation and resourceVersion."""
    out = copy.deepcopy(obj)
    out["spec"].update(fields)
    out["metadata"]["generation"] += 1
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def _run_id(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("runId") or obj["metadata"]["uid"])


def cancel(
    obj: dict[str, Any], requests: dict[str, dict[str, Any]], *, stamped: bool = True
) -> dict[str, Any]:
    """A user adds cancellation requests, through the admission webhook (``requestedBy``,
    ``requestedAt`` and the stamp of :data:`KEYRING`) unless not ``stamped``."""
    if stamped:
        requests = {
            request_id: _stamped_cancellation(obj, request_id, request)
            for request_id, request in requests.items()
        }
    return patch_spec(obj, cancellations={**obj["spec"].get("cancellations", {}), **requests})


def _stamped_cancellation(obj: dict[str, Any], request_id: str, request: dict[str, Any]) -> dict[str, Any]:
    parsed = CancelRequest.model_validate({"requestedBy": CREATOR.wire(), "requestedAt": iso(T0), **request})
    return {**parsed.wire(), "stamp": stamp_cancellation(KEYRING, _run_id(obj), request_id, parsed)}


def decision(
    obj: dict[str, Any], request_id: str, digest: str, verdict: str = "approve", *, by: str = "carol"
) -> dict[str, Any]:
    """``spec.approvals[request_id]`` as the admission webhook writes it: approver, time, stamp."""
    parsed = ApprovalDecision.model_validate(
        {"digest": digest, "decision": verdict, "approver": {"username": by}, "decidedAt": iso(T0)}
    )
    return {**parsed.wire(), "stamp": stamp_decision(KEYRING, _run_id(obj), request_id, parsed)}


def retry_request(obj: dict[str, Any], token: str) -> dict[str, Any]:
    """The spec fields of a quarantine retry as the admission webhook writes them (to ``update``)."""
    request = ControlRequest(requested_by=CREATOR, requested_at=T0)
    stamped = {**request.wire(), "stamp": stamp_retry(KEYRING, _run_id(obj), token, request)}
    return {"retryQuarantine": token, "retryQuarantineRequest": stamped}


# --- steps of a run's spec -----------------------------------------------------------------------


def ask(name: str) -> dict[str, Any]:
    return {"name": name, "ask": {"question": f"{name}?", "expiresIn": "1h"}}


def wait_for_event(name: str) -> dict[str, Any]:
    return {"name": name, "await": {"event": "window-open", "expiresIn": "1h"}}


def effect(name: str, *, compensates: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect": "http.post",
        "target": {"url": "https://payments.example/api"},
        "arguments": {"step": name},
    }
    if compensates is not None:
        body["compensates"] = compensates
    return {"name": name, "effect": body}


# --- settings resolved from an AgentPolicy -------------------------------------------------------


def settings_with(
    *, tier: ActionTier = ActionTier.REVERSIBLE, operator_version: str | None = None, **policy: Any
) -> Settings:
    """Settings resolved from an AgentPolicy (camelCase fields, as in the CRD)."""
    return Settings(
        policy_name="team-policy",
        policy_version="v1",
        policy=AgentPolicySpec.model_validate({"version": "v1", **policy}),
        tiers={"http.post": tier},
        operator_version=operator_version,
    )


# A reversible effect without a policy needs no approval: it goes straight to the ledger.
EFFECTS = Settings(policy_name="team-policy", policy_version="v1", tiers={"http.post": ActionTier.REVERSIBLE})

RETRY_3 = settings_with(retry={"maxAttempts": 3, "initialBackoff": "2s"})


# --- what the shell observes ---------------------------------------------------------------------


def evidence_for(index: int, name: str, *, at_: datetime = T0, rv: str = "4711") -> KubernetesEvidenceRef:
    return KubernetesEvidenceRef(
        id=f"evidence-{index}-{name}",
        step_index=index,
        recorded_at=at_,
        api_version="v1",
        kind="ConfigMap",
        namespace="team-a",
        name="settings",
        uid="cm-uid-1",
        resource_version=rv,
        content_digest=canonical_digest({"data": {"index": index}}),
    )


def failed_read(index: int = 0) -> ReadResult:
    return ReadResult(index, error_reason="NotFound", error_message=NOT_FOUND)


# --- reading commits -----------------------------------------------------------------------------


def commit_of(decision: Decision) -> Commit:
    assert isinstance(decision, Commit), decision
    return decision


def checkpoint_of(source: Commit | dict[str, Any] | None) -> Checkpoint:
    raw = source.checkpoint if isinstance(source, Commit) else source
    result = load_checkpoint(raw)
    assert isinstance(result, Loaded), result
    return result.checkpoint


def cp_of(obj: dict[str, Any]) -> Any:
    return checkpoint_of(obj["status"]["checkpoint"])


def conditions(status: AgentRunStatus) -> dict[str, Condition]:
    return {c.type: c for c in status.conditions}


def condition_view(status: AgentRunStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


def assert_well_formed(before: dict[str, Any], commit: Commit, epoch: Fencing = EPOCH) -> None:
    """What every non-quarantine commit guarantees: one table row, version + 1, fencing stamped."""
    old = AgentRunStatus.model_validate({k: v for k, v in (before.get("status") or {}).items()})
    assert TRANSITIONS[(old.state, commit.event)] is commit.state
    assert commit.status.state_version == old.state_version + 1
    cp = checkpoint_of(commit)
    assert cp.position.state_version == commit.status.state_version
    assert cp.position.state == commit.state.value
    assert cp.fencing == epoch
    last = commit.status.history[-1]
    assert (last.from_state, last.to_state, last.event) == (old.state, commit.state, commit.event.value)
    assert (last.holder, last.epoch, last.state_version) == (
        epoch.holder,
        epoch.lease_transitions,
        commit.status.state_version,
    )


# --- driving decide ------------------------------------------------------------------------------


def step(
    obj: dict[str, Any],
    now: datetime,
    *,
    epoch: Fencing = EPOCH,
    read: ReadResult | None = None,
    settings: Settings = SETTINGS,
) -> Decision:
    """One call of decide, checking on the way that the record it was given is left untouched."""
    before = copy.deepcopy(obj)
    decision = decide(
        snap(obj), now=now, epoch=epoch, planner=PLANNER, settings=settings, observed=Observations(read=read)
    )
    assert obj == before, "decide must not mutate the record it reads"
    return decision


def drive(
    obj: dict[str, Any],
    now: datetime,
    *,
    epoch: Fencing = EPOCH,
    settings: Settings = SETTINGS,
    limit: int = 400,
) -> tuple[dict[str, Any], list[Commit], Idle]:
    """Decide and apply until the engine is idle; reads succeed. Returns the record, commits, idle."""
    commits: list[Commit] = []
    for _ in range(limit):
        decision = step(obj, now, epoch=epoch, settings=settings)
        if isinstance(decision, NeedRead):
            read = ReadResult(decision.step_index, evidence_for(decision.step_index, decision.step_name))
            decision = step(obj, now, epoch=epoch, settings=settings, read=read)
            assert not isinstance(decision, NeedRead), "a read result for the step must be consumed"
        if isinstance(decision, Idle):
            return obj, commits, decision
        commit = commit_of(decision)
        commits.append(commit)
        obj = apply(obj, commit)
    raise AssertionError(f"no idle after {limit} decisions")


def decide_on(
    obj: dict[str, Any],
    now: datetime,
    *,
    settings: Settings = SETTINGS,
    read: ReadResult | None = None,
    actions: dict[str, ActionObservation] | None = None,
    children: dict[str, ChildObservation] | None = None,
) -> Decision:
    """One call of decide, checking that the record it was given is left untouched."""
    before = copy.deepcopy(obj)
    decision = decide(
        snap(obj),
        now=now,
        epoch=EPOCH,
        planner=PLANNER,
        settings=settings,
        observed=Observations(read=read, actions=actions, children=children),
    )
    assert obj == before, "decide must not mutate the record it reads"
    return decision


def advance(
    obj: dict[str, Any],
    now: datetime,
    *,
    settings: Settings = SETTINGS,
    read: ReadResult | None = None,
    actions: dict[str, ActionObservation] | None = None,
    children: dict[str, ChildObservation] | None = None,
) -> tuple[dict[str, Any], Commit]:
    """Decide, expect a well-formed commit, and store it."""
    commit = commit_of(decide_on(obj, now, settings=settings, read=read, actions=actions, children=children))
    assert_well_formed(obj, commit)
    return apply(obj, commit), commit


def expect(
    obj: dict[str, Any], now: datetime, event: RunEvent, state: RunState, **kwargs: Any
) -> tuple[dict[str, Any], Commit]:
    obj, commit = advance(obj, now, **kwargs)
    assert (commit.event, commit.state) == (event, state), commit.detail
    return obj, commit


def walk(obj: dict[str, Any], until: RunState, *, settings: Settings, now: datetime = T0) -> dict[str, Any]:
    """Commit until the run is in ``until``; every read fails (NotFound)."""
    for _ in range(20):
        if obj.get("status", {}).get("state") == until.value:
            return obj
        decision = decide_on(obj, now, settings=settings)
        if isinstance(decision, NeedRead):
            decision = decide_on(obj, now, settings=settings, read=failed_read(decision.step_index))
        commit = commit_of(decision)
        assert_well_formed(obj, commit)
        obj = apply(obj, commit)
    raise AssertionError(f"the run did not reach {until.value}")


def reach(state: RunState) -> tuple[dict[str, Any], Settings]:
    """A run that got to ``state`` the ordinary way, with the settings it runs under."""
    if state is RunState.WAITING_APPROVAL:
        settings = settings_with(tier=ActionTier.CONSEQUENTIAL)
        return walk(new_run(steps=[effect("pay"), DONE]), state, settings=settings), settings
    if state is RunState.WAITING_RETRY:
        return walk(new_run(steps=[READ, DONE]), state, settings=RETRY_3), RETRY_3
    if state is RunState.WAITING_EXTERNAL:
        return walk(new_run(steps=[wait_for_event("window"), DONE]), state, settings=SETTINGS), SETTINGS
    answers = {"confirm": "yes"} if state is RunState.RESUME_VALIDATION else {}
    return walk(new_run(steps=[ask("confirm"), DONE], answers=answers), state, settings=SETTINGS), SETTINGS


def waiting_on_action(
    settings: Settings, steps: list[dict[str, Any]]
) -> tuple[dict[str, Any], ActionRecordSpec]:
    """A run in waiting_external on the intent of its effect step (step 0), and that intent."""
    obj, _ = expect(new_run(steps=steps), T0, RunEvent.ACCEPTED, RunState.READY, settings=settings)
    obj, intent = expect(obj, at(1), RunEvent.EXTERNAL_AWAITED, RunState.WAITING_EXTERNAL, settings=settings)
    (spec,) = intent.intents
    name = action_record_name(spec.idempotency_key)
    assert intent.status.waiting_for == f"action:{name}"
    assert [p.action_record_name for p in checkpoint_of(intent).pending_actions] == [name]
    return obj, spec


def advance_untouched(obj: dict[str, Any], now: datetime) -> tuple[dict[str, Any], Commit]:
    """A commit that must leave the stored checkpoint byte for byte as it is."""
    stored = json.dumps(obj["status"]["checkpoint"])
    commit = commit_of(decide_on(obj, now))
    assert json.dumps(commit.checkpoint) == stored
    assert commit.status.state_version == obj["status"]["stateVersion"] + 1
    return apply(obj, commit), commit
