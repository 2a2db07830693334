"""Authority the operator can verify: what its admission webhook's stamps on a run's requests
vouch for, how a stamp is made, and whether one holds.

Writing a field proves nothing: with the webhook off (or misconfigured), anyone who may patch an
AgentRun can write an approval decision with any ``approver``, a cancellation, a retry token, or
create a run naming any ServiceAccount of the namespace. So the webhook, which has asked the API
server who the user is and whether RBAC lets them, stamps what it admitted
(:mod:`durable_agents.core.stamps`, keys the operator alone holds), and the engine acts only on a
request whose stamp verifies:

- an approval decision (``Purpose.DECISION``): run ID, request ID, decision, digest, reason,
  approver, decision time;
- a cancellation or a quarantine retry (``Purpose.CONTROL``): run ID, request ID (the retry's
  token), scope and reason, who asked, when;
- the run's ServiceAccount (``Purpose.SERVICE_ACCOUNT``, in ``spec.createdBy.stamp``): namespace,
  run name, ServiceAccount, creator and the time it was stamped: the creator was allowed to
  ``use`` it, for the object created then (:func:`creation_unbound`: the API server's
  ``metadata.creationTimestamp``, which no client chooses, must agree with that time);
- a region failover (``Purpose.CONTROL``, in a RegionFailover's ``spec.stamp``): the object's name,
  from, to, reason, who asked, when: they were allowed to ``failover`` the region ``from``.

The run ID is ``status.runId`` (the uid until the first commit), so a stamp copied into another
run does not verify, and a run restored from a backup keeps its stamps. Times are stamped in one
fixed form (:func:`instant`) so that what the webhook stamped and what the engine reads back
agree to the microsecond. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import (
    AgentRunSpec,
    ApprovalDecision,
    CancelRequest,
    ControlRequest,
    Creator,
    Identity,
    PolicyReference,
    RegionFailoverSpec,
)
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id, verify

UNSTAMPED = "Unstamped"
STAMP_INVALID = "StampInvalid"


def instant(moment: datetime) -> str:
    """A time as the webhook writes it and as stamps cover it (UTC, microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _who(identity: Identity) -> dict[str, Any]:
    return identity.who().wire()


def decision_proof(run_id: str, request_id: str, decision: ApprovalDecision) -> dict[str, Any] | None:
    """What a decision's stamp covers; None while it names no approver or time (never stamped)."""
    if decision.approver is None or decision.decided_at is None:
        return None
    return {
        "runId": run_id,
        "requestId": request_id,
        "decision": decision.decision,
        "digest": decision.digest,
        "reason": decision.reason or "",
        "approver": _who(decision.approver),
        "decidedAt": instant(decision.decided_at),
    }


def cancellation_proof(run_id: str, request_id: str, request: CancelRequest) -> dict[str, Any] | None:
    """What a cancellation's stamp covers; None while it names nobody who asked, or no time."""
    if request.requested_by is None or request.requested_at is None:
        return None
    return {
        "runId": run_id,
        "requestId": request_id,
        "scope": request.scope.value,
        "reason": request.reason,
        "requestedBy": _who(request.requested_by),
        "requestedAt": instant(request.requested_at),
    }


def retry_proof(run_id: str, token: str, request: ControlRequest | None) -> dict[str, Any] | None:
    """What a quarantine retry's stamp covers (in ``spec.retryQuarantineRequest``)."""
    if request is None or request.requested_by is None or request.requested_at is None:
        return None
    return {
        "runId": run_id,
        "retryQuarantine": token,
        "requestedBy": _who(request.requested_by),
        "requestedAt": instant(request.requested_at),
    }


def policy_proof(ref: PolicyReference | None) -> dict[str, str] | None:
    """What a creation stamp says of the policy the run names (None: it names none)."""
    return None if ref is None else {"kind": ref.policy_kind.value, "name": ref.name}


def service_account_proof(
    namespace: str,
    name: str,
    service_account: str,
    creator: Identity,
    stamped_at: datetime,
    policy_ref: PolicyReference | None = None,
) -> dict[str, Any]:
    """What the creator's stamp covers: this creator may act as this ServiceAccount, under the
    policy it names (``policyRef``: they may ``use`` it; absent when it names none, so stamps of
    runs naming no policy are what they were), in the run of this name created at ``stamped_at``
    (the uid is not known when a creation is stamped)."""
    proof: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "serviceAccountName": service_account,
        "creator": _who(creator),
        "stampedAt": instant(stamped_at),
    }
    named = policy_proof(policy_ref)
    if named is not None:
        proof["policyRef"] = named
    return proof


# How far the stamp's time and the object's creationTimestamp may be apart. The webhook stamps
# in the request that creates the object, and the API server sets creationTimestamp (whole
# seconds, rounded down) in that same request: they differ by the request's latency, under a
# second, plus the clock difference between the operator's node and the API server's. A copy
# re-created later than this after the original's creation is refused.
CREATION_SKEW = timedelta(seconds=5)
STAMP_UNTIMED = "StampUntimed"
STAMP_NOT_OF_THIS_OBJECT = "StampNotOfThisObject"


def creation_unbound(stamped_at: datetime | None, created_at: datetime | None) -> Unproven | None:
    """Why a ``createdBy`` stamp made at ``stamped_at`` is not the one made when this object was
    created (``metadata.creationTimestamp``), or None: within :data:`CREATION_SKEW` either way."""
    if stamped_at is None:
        return Unproven(
            STAMP_UNTIMED,
            "spec.createdBy carries no stampedAt (stamped by an operator release before creation "
            "stamps carried their time): it cannot be bound to this object; create the run again",
        )
    if created_at is None:
        return Unproven(STAMP_NOT_OF_THIS_OBJECT, "the run has no metadata.creationTimestamp")
    apart = abs(stamped_at - created_at)
    if apart <= CREATION_SKEW:
        return None
    return Unproven(
        STAMP_NOT_OF_THIS_OBJECT,
        f"spec.createdBy was stamped at {instant(stamped_at)}, but this object was created at "
        f"{instant(created_at)} ({apart.total_seconds():.0f}s apart, more than "
        f"{CREATION_SKEW.total_seconds():.0f}s): it was stamped for an earlier object of this name "
        "(a copied createdBy)",
    )


def failover_proof(name: str, spec: RegionFailoverSpec) -> dict[str, Any] | None:
    """What a RegionFailover's stamp covers; None while it names nobody who asked, or no time."""
    if spec.requested_by is None or spec.requested_at is None:
        return None
    return {
        "kind": "RegionFailover",  # the purpose is shared with runs' controls: never one of theirs
        "name": name,
        "from": spec.from_region,
        "to": spec.to,
        "reason": spec.reason or "",
        "requestedBy": _who(spec.requested_by),
        "requestedAt": instant(spec.requested_at),
    }


def _stamped(keyring: Keyring, purpose: Purpose, proof: Mapping[str, Any] | None, what: str) -> str:
    if proof is None:
        raise ValueError(f"{what} names nobody to stamp")
    return stamp(keyring, purpose, proof)


def stamp_decision(keyring: Keyring, run_id: str, request_id: str, decision: ApprovalDecision) -> str:
    return _stamped(keyring, Purpose.DECISION, decision_proof(run_id, request_id, decision), "a decision")


def stamp_cancellation(keyring: Keyring, run_id: str, request_id: str, request: CancelRequest) -> str:
    proof = cancellation_proof(run_id, request_id, request)
    return _stamped(keyring, Purpose.CONTROL, proof, "a cancellation")


def stamp_retry(keyring: Keyring, run_id: str, token: str, request: ControlRequest) -> str:
    return _stamped(keyring, Purpose.CONTROL, retry_proof(run_id, token, request), "a retry")


def stamp_failover(keyring: Keyring, name: str, spec: RegionFailoverSpec) -> str:
    """The stamp for RegionFailover ``name`` with this spec (its requestedBy and requestedAt set)."""
    return _stamped(keyring, Purpose.CONTROL, failover_proof(name, spec), "a region failover")


def stamp_creator(
    keyring: Keyring,
    namespace: str,
    name: str,
    service_account: str,
    creator: Identity,
    at: datetime,
    policy_ref: PolicyReference | None = None,
) -> dict[str, Any]:
    """``spec.createdBy`` for a run this creator may create as ``service_account`` under
    ``policy_ref``, in the request that creates it (``at``: now): the identity, the time and the
    operator's stamp over them."""
    proof = service_account_proof(namespace, name, service_account, creator, at, policy_ref)
    stamped = stamp(keyring, Purpose.SERVICE_ACCOUNT, proof)
    return {**_who(creator), "stampedAt": instant(at), "stamp": stamped}


@dataclass(frozen=True)
class Unproven:
    """Why a request's authority cannot be verified: ``reason`` is a condition reason."""

    reason: str
    message: str


def unproven(
    keyring: Keyring | None,
    purpose: Purpose,
    proof: Mapping[str, Any] | None,
    value: str | None,
    what: str,
) -> Unproven | None:
    """None if ``value`` is this keyring's stamp over ``proof``; else why not.

    Without a keyring (pure tests and tools: the operator never runs without one) nothing is
    stamped, so nothing is verified.
    """
    if keyring is None:
        return None
    if proof is None or not value:
        return Unproven(
            UNSTAMPED,
            f"{what} carries no stamp of the operator's admission webhook (written while the webhook "
            "was off, or by hand)",
        )
    try:
        authentic = verify(keyring, purpose, proof, value)
    except (TypeError, ValueError):  # not what was stamped (a stamp is made over plain JSON)
        authentic = False
    if authentic:
        return None
    key_id = stamp_key_id(value)
    if key_id not in keyring.keys:
        return Unproven(
            STAMP_INVALID,
            f"{what} is stamped with key {key_id!r}, which is not in this operator's keyring",
        )
    return Unproven(
        STAMP_INVALID,
        f"{what} has a stamp that does not verify: these fields were not admitted as they are by "
        "the operator's admission webhook",
    )


def decision_unproven(
    keyring: Keyring | None, run_id: str, request_id: str, decision: ApprovalDecision
) -> Unproven | None:
    proof = decision_proof(run_id, request_id, decision)
    return unproven(keyring, Purpose.DECISION, proof, decision.stamp, f"the decision on {request_id!r}")


def cancellation_unproven(
    keyring: Keyring | None, run_id: str, request_id: str, request: CancelRequest
) -> Unproven | None:
    proof = cancellation_proof(run_id, request_id, request)
    return unproven(keyring, Purpose.CONTROL, proof, request.stamp, f"cancellation {request_id!r}")


def retry_unproven(
    keyring: Keyring | None, run_id: str, token: str, request: ControlRequest | None
) -> Unproven | None:
    proof = retry_proof(run_id, token, request)
    value = request.stamp if request is not None else None
    return unproven(keyring, Purpose.CONTROL, proof, value, f"retryQuarantine {token!r}")


def service_account_unproven(
    keyring: Keyring | None,
    namespace: str,
    name: str,
    spec: AgentRunSpec,
    created_at: datetime | None,
    untimed_before: datetime | None = None,
) -> Unproven | None:
    """Why the run may not act as its ServiceAccount, or None: its creator's stamp must verify,
    and have been made when this object was created (``created_at``: its creationTimestamp).
    A stamp of the release before stamps carried their time is accepted only on an object created
    before ``untimed_before`` (this operator's start: a run that waited across the upgrade, say
    for its policy); one created since cannot be told from a copy."""
    creator = spec.created_by
    sa = spec.service_account_name
    what = f"the run's use of ServiceAccount {sa!r}"
    if creator is not None and creator.stamp and creator.stamped_at is None:
        # The form before stamps carried their time: said as such if it is the operator's, but
        # never acted on (it would verify in any object of this name).
        untimed = {"namespace": namespace, "name": name, "serviceAccountName": sa, "creator": _who(creator)}
        found = unproven(keyring, Purpose.SERVICE_ACCOUNT, untimed, creator.stamp, what)
        upgraded = untimed_before is not None and created_at is not None and created_at < untimed_before
        if found is None and keyring is not None and not upgraded:
            found = creation_unbound(None, created_at)
    else:
        proof = (
            service_account_proof(namespace, name, sa, creator, creator.stamped_at, spec.policy_ref)
            if creator is not None and creator.stamped_at is not None
            else None
        )
        found = unproven(keyring, Purpose.SERVICE_ACCOUNT, proof, creator.stamp if creator else None, what)
        if found is not None and proof is not None and "policyRef" in proof:
            found = _before_policy_stamps(keyring, proof, creator, created_at, untimed_before, found, what)
        if found is None and keyring is not None and creator is not None:
            found = creation_unbound(creator.stamped_at, created_at)
    if found is None:
        return None
    who = f" by {creator.username!r}" if creator is not None else ""
    ref = spec.policy_ref
    under = f" under {ref.policy_kind.value} {ref.name!r}" if ref is not None else ""
    return Unproven(
        found.reason, f"{found.message}; no proof that its creator{who} may use ServiceAccount {sa!r}{under}"
    )


def _before_policy_stamps(
    keyring: Keyring | None,
    proof: dict[str, Any],
    creator: Creator | None,
    created_at: datetime | None,
    untimed_before: datetime | None,
    found: Unproven,
    what: str,
) -> Unproven | None:
    """A stamp of the release before creation stamps covered ``policyRef`` (the same proof without
    it) counts only on a run created before ``untimed_before`` (this operator's start: a run that
    waited across the upgrade); one created since could have switched policy under a copied stamp."""
    legacy = {key: value for key, value in proof.items() if key != "policyRef"}
    upgraded = untimed_before is not None and created_at is not None and created_at < untimed_before
    if not upgraded or creator is None:
        return found
    if unproven(keyring, Purpose.SERVICE_ACCOUNT, legacy, creator.stamp, what) is not None:
        return found
    return None


NO_KEYRING = "NoKeyring"


def failover_unproven(keyring: Keyring | None, name: str, spec: RegionFailoverSpec) -> Unproven | None:
    """Why RegionFailover ``name`` is not proven to be what the admission webhook admitted, or None.

    Unlike a run's requests, a failover is never taken on trust without a keyring: moving a
    region's runs on an unverifiable request could apply their effects twice.
    """
    if keyring is None:
        return Unproven(NO_KEYRING, "this operator has no keyring: it cannot verify a failover's stamp")
    what = f"region failover {name!r}"
    return unproven(keyring, Purpose.CONTROL, failover_proof(name, spec), spec.stamp, what)


def failover_verifies(keyring: Keyring | None, name: str, spec: RegionFailoverSpec) -> bool:
    """True only if ``spec.stamp`` is this keyring's stamp over ``name`` and this spec."""
    return failover_unproven(keyring, name, spec) is None
