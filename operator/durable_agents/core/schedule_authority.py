"""A schedule's authority: whose runs it starts, and the proof of it. Pure: no I/O.

A schedule must never let anyone start runs with more authority than they could by hand. So:

- The admission webhook stamps ``spec.createdBy`` of a new AgentSchedule with the request's user
  (after checking they may create AgentRuns in the namespace and ``use`` the template's
  ServiceAccount and policy, as for a run they create by hand). The stamp
  (``Purpose.SERVICE_ACCOUNT``, with ``kind: AgentSchedule`` so it is never a run's) covers the
  namespace, the schedule's name, the creator, the time (bound to the schedule's
  creationTimestamp, as a run's: a copied ``createdBy`` proves nothing) and the digest of the run
  template (immutable: the creator's runs run what the creator wrote).
- Before starting anything the operator verifies that stamp (:func:`schedule_unproven`); an
  unstamped or forged schedule starts nothing and says why in its Ready condition. It then asks
  the API server again (SubjectAccessReviews) whether the creator may still do all that, and
  creates the run with ``spec.createdBy`` stamped for the creator
  (:func:`durable_agents.core.request_stamps.stamps`), so the run is governed exactly as if the
  creator had created it (its ServiceAccount, its policy, four-eyes approvals).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    SCHEDULE_LABEL,
    SCHEDULED_AT_ANNOTATION,
    AgentRunSpec,
    AgentScheduleSpec,
    CancelRequest,
    CancelScope,
    Identity,
)
from durable_agents.core.authority import (
    Unproven,
    creation_unbound,
    instant,
    service_account_unproven,
    stamp_cancellation,
    unproven,
)
from durable_agents.core.digest import canonical_digest
from durable_agents.core.retention import label_value
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp

SCHEDULE_KIND = "AgentSchedule"
# What a run's spec never takes from a template: requests are made on a live run (bound to its ID),
# and createdBy is the schedule's verified creator, stamped when the run is created.
NOT_FROM_TEMPLATE = (
    "createdBy",
    "answers",
    "events",
    "approvals",
    "cancellations",
    "reconciliations",
    "retryQuarantine",
    "retryQuarantineRequest",
    "reconcileNow",
    "escalation",
    "parentRef",
)

# A schedule starts runs for its creator only if they may create them by hand: asked at admission
# and again before every start (a standard verb, checked beside USE_VERB on the ServiceAccount).
CREATE_RUN_VERB = "create"


def template_problem(template: Mapping[str, Any]) -> str | None:
    """Why a run template cannot be a new run's spec, or None."""
    present = [field for field in NOT_FROM_TEMPLATE if template.get(field)]
    if present:
        return (
            f"spec.runTemplate.{present[0]}: a run starts without it (requests are made on a live run; "
            "createdBy is the schedule's creator, stamped by the operator)"
        )
    return None


def template_digest(template: AgentRunSpec) -> str:
    """The digest of a run template as the operator reads it (defaults left out, so a defaulted
    field and the same value written out digest alike)."""
    return canonical_digest(template.model_dump(mode="json", by_alias=True, exclude_defaults=True))


def schedule_proof(
    namespace: str, name: str, creator: Identity, stamped_at: datetime, template: AgentRunSpec
) -> dict[str, Any]:
    """What a schedule's creator stamp covers."""
    return {
        "kind": SCHEDULE_KIND,  # never a run's proof (a run's has no kind)
        "namespace": namespace,
        "name": name,
        "creator": creator.who().wire(),
        "stampedAt": instant(stamped_at),
        "template": template_digest(template),
    }


def stamp_schedule(
    keyring: Keyring, namespace: str, name: str, creator: Identity, at: datetime, template: AgentRunSpec
) -> dict[str, Any]:
    """``spec.createdBy`` for a new schedule: the creator, the time and the operator's stamp."""
    proof = schedule_proof(namespace, name, creator, at, template)
    return {
        **creator.who().wire(),
        "stampedAt": instant(at),
        "stamp": stamp(keyring, Purpose.SERVICE_ACCOUNT, proof),
    }


def schedule_unproven(
    keyring: Keyring | None, namespace: str, name: str, spec: AgentScheduleSpec, created_at: datetime | None
) -> Unproven | None:
    """Why this schedule's ``createdBy`` is not the webhook's stamp for it, or None."""
    creator = spec.created_by
    what = f"AgentSchedule {name!r}'s createdBy"
    proof = (
        schedule_proof(namespace, name, creator, creator.stamped_at, spec.run_template)
        if creator is not None and creator.stamped_at is not None
        else None
    )
    found = unproven(keyring, Purpose.SERVICE_ACCOUNT, proof, creator.stamp if creator else None, what)
    if found is None and keyring is not None and creator is not None:
        found = creation_unbound(creator.stamped_at, created_at)
    return found


def run_body(
    schedule: Mapping[str, Any], spec: AgentScheduleSpec, slot: datetime, name: str
) -> dict[str, Any]:
    """The AgentRun a schedule starts for ``slot`` (without ``createdBy``: stamped when sent),
    owned by the schedule (history limits, garbage collection with it)."""
    meta = schedule.get("metadata") or {}
    template = {
        k: v
        for k, v in spec.run_template.model_dump(mode="json", by_alias=True, exclude_none=True).items()
        if k not in NOT_FROM_TEMPLATE
    }
    owner = {
        "apiVersion": API_VERSION,
        "kind": SCHEDULE_KIND,
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "controller": True,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": str(meta.get("namespace") or ""),
            "labels": {SCHEDULE_LABEL: label_value(str(meta.get("name") or ""))},
            "annotations": {SCHEDULED_AT_ANNOTATION: instant(slot)},
            "ownerReferences": [owner],
        },
        "spec": template,
    }


REPLACE_REQUEST_ID = "schedule-replace"


def replace_cancellation(
    run: Mapping[str, Any], keyring: Keyring, operator: str, now: datetime, reason: str
) -> dict[str, Any]:
    """``spec.cancellations`` for a running run a Replace schedule replaces: its own cancellation
    path (task scope), stamped as the webhook would (it re-stamps it as the operator's user), as
    retention cancels a deleted run."""
    entry: dict[str, Any] = {
        "scope": CancelScope.TASK.value,
        "reason": reason[:1024],
        "requestedBy": {"username": operator},
        "requestedAt": instant(now),
    }
    status, meta = run.get("status") or {}, run.get("metadata") or {}
    run_id = str(status.get("runId") or meta.get("uid") or "")
    request = CancelRequest.model_validate(entry)
    return {
        REPLACE_REQUEST_ID: {
            **entry,
            "stamp": stamp_cancellation(keyring, run_id, REPLACE_REQUEST_ID, request),
        }
    }


def vouched_creator(new: Mapping[str, Any], user: Identity, keyring: Keyring, created_at: datetime) -> bool:
    """Whether a new run's ``createdBy`` is one the operator stamped for a schedule's creator, to
    be kept (not replaced by the requester): the run is created AS its own ServiceAccount (whose
    authority it has anyway), controlled by an AgentSchedule, and ``createdBy`` names someone
    else and verifies as the stamp for this object (its name, ServiceAccount, policy, creation
    time). Only the operator makes such a stamp, after checking that creator's rights."""
    meta = new.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    if not any(
        isinstance(r, Mapping) and r.get("kind") == SCHEDULE_KIND and r.get("controller") for r in refs
    ):
        return False
    raw = new.get("spec") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    sa = str(raw.get("serviceAccountName") or "default")
    if user.username != f"system:serviceaccount:{namespace}:{sa}":
        return False
    try:
        spec = AgentRunSpec.model_validate(raw)
    except ValueError:
        return False
    creator = spec.created_by
    if creator is None or creator.username == user.username:
        return False
    return service_account_unproven(keyring, namespace, name, spec, created_at) is None
