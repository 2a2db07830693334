"""What the operator accepted a run to do, and whether its spec still says so.

The spec's immutable fields are refused a change at admission, by the AgentRun spec policy (a
ValidatingAdmissionPolicy: :mod:`durable_agents.api.spec_policy`), whose rules left the CRD so
that the API server does not evaluate them on every status write. A cluster can lack that policy
(CRDs applied without the chart), so the operator keeps a second line: at acceptance it records
the digest of the run's immutable fields in the checkpoint (``plan``, covered by the integrity
stamp) and compares it at every decision; a run whose spec no longer matches is quarantined
``SpecChanged`` before anything more is done. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from durable_agents.api.v1alpha1 import AgentRunSpec
from durable_agents.core.digest import canonical_digest

DEFINING_FIELDS: Final = (
    "task_type",
    "objective",
    "owner",
    "tenant",
    "service_account_name",
    "policy_ref",
    "agent",
    "agent_ref",
    "deadline",
    "steps",
)
"""What makes a run do what it was asked (an adopted child must match its step on each too)."""

PLAN_FIELDS: Final = frozenset({*DEFINING_FIELDS, "parent_ref"})
"""Every spec field fixed at creation that decides what the run does. Not ``createdBy`` (its
stamp is verified at acceptance, which it decides; after that it is a record for people), nor
``region`` (its own rules stay in the CRD), nor the requests to a live run (answers, approvals,
cancellations, ...: append-only, each one stamped or recorded in the checkpoint when acted on)."""

SPEC_CHANGED: Final = "SpecChanged"


def plan_digest(spec: AgentRunSpec) -> str:
    """The digest of the spec's :data:`PLAN_FIELDS` as parsed (the stored form: sealed values as
    sealed); a field at its default counts as absent, so a release that adds a defaulted field
    does not change the digest of a run accepted before it."""
    fields = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True, include=set(PLAN_FIELDS))
    return canonical_digest(fields)


def changed_since_accepted(recorded: str | None, current: str) -> str | None:
    """Why a spec whose :func:`plan_digest` is ``current`` is not what was accepted (``recorded``:
    the checkpoint's plan), or None (the same, or nothing recorded yet)."""
    if recorded is None or current == recorded:
        return None
    fields = ", ".join(sorted(_camel(name) for name in PLAN_FIELDS))
    return (
        "the spec changed after the run was accepted (its digest is not the plan the checkpoint "
        f"recorded; {fields} cannot change once the run exists): nothing more is done for it; "
        "the AgentRun spec policy (a ValidatingAdmissionPolicy of the chart) refuses such a change, "
        "check that it is installed"
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
