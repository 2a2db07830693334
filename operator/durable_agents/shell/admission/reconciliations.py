"""The admission webhook's rules for ``spec.reconciliations``: a person's answer for an action
whose outcome is unknown (:mod:`durable_agents.core.reconciliations`).

- Mutating (:func:`reconciliation_stamps`): every NEW entry gets ``reconciler`` (the request's
  authenticated user, never what the client wrote), ``reconciledAt`` and the operator's stamp.
- Validating (:func:`check_reconciliations`): each new entry must carry this user's identity and
  the webhook's stamp; the user must hold the run's policy approver verb (``approvers.verb`` on
  ``approvers.resource``, default ``approve`` on ``agentruns``: the SubjectAccessReview approvals
  use); and the ActionRecord it names must be this run's, ``outcome_unknown`` (as believed: a
  settled state without a valid outcome stamp counts as unknown), at the attempt the
  entry answers for, and not answered for already by an entry whose stamp verifies (one written
  with the webhook off answers for nothing, and blocks nobody: the next free key is used).
  Append-only is :mod:`.admission`'s rule.

The operator (its dispatcher) acts only on an entry whose stamp verifies: with the webhook off, an
entry written by hand is never acted on (:mod:`durable_agents.shell.ledger.reconciling`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import AgentPolicySpec, ApproverRule, Identity, Reconciliation
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.reconciliations import (
    added_reconciliations,
    reconciliation_entries,
    reconciliation_unproven,
    record_of,
    record_refusal,
    run_id_of,
    verifies,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ground.store import Gone
from durable_agents.shell.ledger.actions import ActionStore

# admission.refused_verb: (kube, user, verb, resource, namespace, name) -> why not, or None.
RefusedVerb = Callable[[Kube, Identity, str, str, str, str], Awaitable[str | None]]


async def check_reconciliations(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    refused_verb: RefusedVerb,
) -> str | None:
    """Why the new entries of ``spec.reconciliations`` must be refused, or None."""
    keys = added_reconciliations(new, old)
    if not keys:
        return None
    run_id = run_id_of(old)
    entries = {key: Reconciliation.model_validate(reconciliation_entries(new)[key]) for key in keys}
    for key, entry in entries.items():
        if entry.reconciler is None or entry.reconciler.username != user.username:
            return "the reconciler identity must be the requesting user's (it is stamped by the webhook)"
        if reconciliation_unproven(keyring, run_id, key, entry) is not None:
            return f"spec.reconciliations[{key!r}] is not stamped by the admission webhook"
    # Authority before anything about the records: who may not reconcile learns nothing of them.
    rule = policy.approvers if policy is not None else ApproverRule()
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    refused = await refused_verb(kube, user, rule.verb, rule.resource, namespace, name)
    if refused is not None:
        return f"{refused} (spec.reconciliations[{keys[0]!r}])"
    store, taken, verified = (
        ActionStore(kube, keyring),
        dict(reconciliation_entries(old)),
        verifies(keyring, run_id),
    )
    for key, entry in entries.items():
        try:
            record: dict[str, Any] | None = await store.get(namespace, record_of(key))
        except Gone:
            record = None
        if record is not None:  # its state as the operator wrote it: a forged settled one is unknown
            record = {**record, "status": believed_status(record, keyring, datetime.now(UTC)).wire()}
        problem = record_refusal(key, entry, record, name, taken, verified)
        if problem is not None:
            return problem
        taken[key] = reconciliation_entries(new)[
            key
        ]  # two answers for one attempt in one patch: the second is refused
    return None
