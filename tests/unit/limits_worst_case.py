"""The largest status the operator writes for a run at every admission bound, built from the API
and checkpoint models with every field at the longest value the engine puts there.

Bounds used (each from the schema, the webhook's limits, or the engine's own truncation):
- 64 steps (schema), step names 63 characters, effect names 128, object references at their
  schema maxima (apiVersion 253, kind 63, name 253, namespace 63), a run name of 253 characters;
- per step: one record of what it did (an evidence reference and a tool call), plus
  FAILED_ATTEMPTS_PER_STEP failed attempts each leaving a tool call (error: 1024 characters,
  truncated by the engine) and an evidence reference;
- the approval request: the largest target (64 KiB) and the largest arguments, sealed;
  64 evidence IDs; policy reason 1024; one approval record per effect step plus re-approvals;
- the pending question, sealed (SEALED_STRING_MAX); 64 children; 16 cancellations;
- history (HISTORY_LIMIT entries, detail 512), refused requests (REFUSED_LIMIT, message 512),
  16 conditions with 4096-character messages, an outcome with a 4096-character message and result.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import PINNED_PROMPT_MAX
from durable_agents.api.v1alpha1.agentrun import HISTORY_LIMIT, REFUSED_LIMIT
from durable_agents.api.v1alpha1.meta import SEALED_STRING_MAX
from durable_agents.core.checkpoint import (
    ApprovalRecord,
    CancellationRecord,
    Checkpoint,
    ChildRecord,
    ExternalEvidenceRef,
    Fencing,
    KubernetesEvidenceRef,
    PendingAction,
    PendingInput,
    PolicyRef,
    Position,
    RetryState,
    RuntimeConfig,
    Timestamps,
    ToolCallRecord,
    dump_checkpoint,
)
from durable_agents.core.definitions import PINNED_DEFINITION_MAX, PinnedDefinition
from durable_agents.core.digest import canonical_json
from durable_agents.core.limits import MAX_VALUE_BYTES, sealed_size

STEPS = 64
FAILED_ATTEMPTS_PER_STEP = 1
"""Failed attempts whose records the checkpoint keeps per step (see the module docstring of
test_limits and the report: the engine does not bound this yet; a policy allows 100 attempts)."""
RUN = "r" * 253
NS = "n" * 63
DIGEST = "sha256:" + "0" * 64
STAMP = "k" * 32 + ":" + "A" * 44


def _step(i: int) -> str:
    return f"{i:02d}" + "s" * 61


def _sealed(size: int, is_string: bool) -> Any:
    token = "sealed:v1:" + "A" * (sealed_size(size, True) - len("sealed:v1:") - 2)
    return token if is_string else {"durable-agents.io/sealed": token}


def _records(now: datetime, i: int) -> tuple[list[Any], list[ToolCallRecord]]:
    name = _step(i)
    read = KubernetesEvidenceRef(
        id=f"evidence-{i}-{name}",
        step_index=i,
        recorded_at=now,
        api_version="a" * 253,
        kind="K" * 63,
        namespace=NS,
        name="o" * 253,
        uid="u" * 36,
        resource_version="9" * 20,
        content_digest=DIGEST,
    )
    evidence: list[Any] = [read]
    calls = [
        ToolCallRecord(
            id=f"call-{i}-{name}",
            tool="e" * 128,
            step_index=i,
            started_at=now,
            finished_at=now,
            outcome="succeeded",
            result_ref=read.id,
        )
    ]
    for attempt in range(FAILED_ATTEMPTS_PER_STEP):
        ref = ExternalEvidenceRef(
            id=f"action-{i}-{attempt:012d}",
            step_index=i,
            recorded_at=now,
            uri=f"actionrecord://{NS}/{'a' * 253}",
            content_digest=DIGEST,
        )
        evidence.append(ref)
        calls.append(
            ToolCallRecord(
                id=f"call-{i}-{attempt:012d}",
                tool="e" * 128,
                step_index=i,
                started_at=now,
                finished_at=now,
                outcome="failed",
                result_ref=ref.id,
                error="x" * 1024,
                attempt=attempt,
            )
        )
    return evidence, calls


def worst_checkpoint(now: datetime) -> Checkpoint:
    evidence: list[Any] = []
    calls: list[ToolCallRecord] = []
    inputs = []
    for i in range(STEPS):
        more, made = _records(now, i)
        evidence += more
        calls += made
        inputs.append(
            ExternalEvidenceRef(
                id=f"answer-{_step(i)}",
                step_index=i,
                recorded_at=now,
                uri=f"agentrun://{NS}/{RUN}/spec.answers/{_step(i)}",
                content_digest=DIGEST,
            )
        )
    approvals = [
        ApprovalRecord(
            request_id=f"{_step(i % STEPS)}-{i // STEPS + 1}",
            digest=DIGEST,
            step_index=i % STEPS,
            expires_at=now,
            policy_version="v" * 63,
            decision="approved",
            decided_by="d" * 253,
            decided_at=now,
        )
        for i in range(STEPS + 32)
    ]
    return Checkpoint(
        position=Position(state="waiting_input", step=STEPS - 1, state_version=10**9),
        fencing=Fencing(holder="h" * 253, lease_transitions=10**9),
        evidence=evidence,
        input_refs=inputs,
        tool_calls=calls,
        pending_actions=[
            PendingAction(
                idempotency_key="i" * 71,
                action_record_name="act-" + "a" * 249,
                effect="e" * 128,
                tier="consequential",
                step_index=STEPS - 1,
                approval_request_id=approvals[-1].request_id,
            )
        ],
        approvals=approvals,
        policy=PolicyRef(name="p" * 253, version="v" * 63),
        runtime_config=RuntimeConfig(
            model="m" * 253, prompt="p" * 253, tool_set="t" * 253, operator="o" * 253
        ),
        trace_link="00-" + "0" * 32 + "-" + "0" * 16 + "-01",
        retry=RetryState(attempts=99, retry_at=now, last_failure="x" * 1024),
        timestamps=Timestamps(created_at=now, updated_at=now, entered_state_at=now),
        pending_input=PendingInput(
            request_id=_step(STEPS - 1),
            question="q" * SEALED_STRING_MAX,
            expires_at=now + timedelta(days=365),
        ),
        children=[
            ChildRecord(name=f"{i:02d}" + "c" * 251, step_index=i, outcome="failed", reason="r" * 128)
            for i in range(STEPS)
        ],
        cancellations=[
            CancellationRecord(request_id="c" * 128 + str(i), scope="task", step_index=i, handled_at=now)
            for i in range(16)
        ],
        definition=_worst_definition(),
        integrity=STAMP,
    )


def _worst_definition() -> PinnedDefinition:
    """A run of an Agent: the largest definition it pins (PINNED_DEFINITION_MAX, prompt included)."""
    digest = "sha256:" + "0" * 64
    base = PinnedDefinition(
        agent_ref="a" * 253,
        model_ref="m" * 253,
        digest=digest,
        agent_digest=digest,
        model_digest=digest,
        prompt_digest=digest,
        tool_set_digest=digest,
        protocol="openai-chat",
        agent={},
        system_prompt="p" * PINNED_PROMPT_MAX,
        approved_under=digest,
    )
    used = len(canonical_json(base.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return base.model_copy(update={"agent": {"tools": "t" * (PINNED_DEFINITION_MAX - used - 16)}})


def worst_status(now: datetime) -> dict[str, Any]:
    at = now.isoformat().replace("+00:00", "Z")
    identity = "e" * 63
    return {
        "state": "waiting_approval",
        "stateVersion": 10**9,
        "stateSince": at,
        "runId": "u" * 128,
        "waitingFor": "w" * 253,
        "observedGeneration": 10**9,
        "outcome": {"reason": "R" * 128, "message": "m" * 4096, "result": "r" * 4096},
        "conditions": [
            {
                "type": f"Type{chr(65 + i)}",
                "status": "True",
                "reason": "R" * 128,
                "message": "m" * 4096,
                "lastTransitionTime": at,
                "observedGeneration": 10**9,
            }
            for i in range(16)
        ],
        "history": [
            {
                "stateVersion": 10**9 + i,
                "event": "e" * 63,
                "from": "waiting_input",
                "to": "waiting_approval",
                "at": at,
                "holder": "h" * 253,
                "epoch": 10**9,
                "detail": "d" * 512,
            }
            for i in range(HISTORY_LIMIT)
        ],
        "approvalRequest": {
            "requestId": "r" * 128,
            "digest": DIGEST,
            "step": _step(0),
            "effect": identity * 2 + "ee",
            "tier": "consequential",
            "target": {"t": "x" * (MAX_VALUE_BYTES - 8)},
            "arguments": _sealed(MAX_VALUE_BYTES, False),
            "evidence": ["v" * 253] * 64,
            "policyVersion": "v" * 63,
            "policyReason": "p" * 1024,
            "approverRole": "a" * 253,
            "serviceAccount": "s" * 253,
            "expiresAt": at,
            "allowedDecisions": ["approve", "reject"],
        },
        "cancellation": {
            "requestId": "c" * 128,
            "scope": "task",
            "reason": "r" * 1024,
            "requestedAt": at,
            "unreversedEffects": [
                {"step": _step(i), "effect": "e" * 128, "actionRecord": "a" * 253, "state": "s" * 32}
                for i in range(64)
            ],
            "canceledActions": ["a" * 253] * 64,
            "proposedCompensations": [_step(i) for i in range(64)],
        },
        "retryAt": at,
        "quarantineRetried": "q" * 63,
        "refusedRequests": [
            {"field": "approvals", "key": "k" * 128, "reason": "R" * 64, "message": "m" * 512, "at": at}
            for _ in range(REFUSED_LIMIT)
        ],
        "checkpoint": dump_checkpoint(worst_checkpoint(now)),
    }
