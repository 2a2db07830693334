"""``spec.steps``: the steps of a scripted run, each exactly one kind (read, ask, await, effect,
complete, child)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.meta import (
    DURATION_PATTERN,
    NAME_PATTERN,
    REQUEST_ID_PATTERN,
    SEALED_STRING_MAX,
    ApiModel,
    ObjectReference,
    bounded_duration,
    cel,
)


class ReadStep(ApiModel):
    """Read a Kubernetes object as the run's ServiceAccount; record it as an evidence reference."""

    object: ObjectReference
    """The object to read, as the run's ServiceAccount."""


class AskStep(ApiModel):
    """Enter waiting_input with a question; answered via ``spec.answers[requestId]``."""

    question: str = Field(
        min_length=1,
        max_length=SEALED_STRING_MAX,
        description="The question for a person; sealed by the admission webhook.",
    )
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )
    """How long to wait for the answer (at most 8760h) before the run expires; unset: the policy's
    waitExpiries.input."""


class AwaitStep(ApiModel):
    """Enter waiting_external until ``spec.events[event]`` is set."""

    event: str = Field(max_length=63, pattern=REQUEST_ID_PATTERN)
    """The event's name: the key it is delivered under in spec.events."""
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )
    """How long to wait for the event (at most 8760h) before the run expires; unset: the policy's
    waitExpiries.external."""


class CompleteStep(ApiModel):
    """Finish the run with a result."""

    result: str = Field(default="", max_length=4096)
    """The run's result, recorded in status.outcome.result."""


class EffectStep(ApiModel):
    """Perform a side effect through the action ledger (intent, dispatch, reconcile).

    ``effect`` names an effect plugin (built in: ``http.post``, ``kubernetes.apply``); ``target``
    and ``arguments`` are the plugin's. ``compensates`` names an earlier effect step whose action
    this one compensates: compensation is a new action, never a rollback by assumption.
    """

    effect: str = Field(max_length=128, pattern=r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
    """The effect plugin (http.post, kubernetes.apply or an installed one); its tier comes from the
    policy's tiers, else the plugin."""
    target: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Where the effect lands, in the plugin's terms; covered by the approval digest."""
    arguments: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """What the effect is sent, in the plugin's terms; a value may be a Secret reference
    ({valueFrom: {secretKeyRef: {name, key}}}), read right before the send and never stored."""
    compensates: str | None = Field(default=None, max_length=63, pattern=NAME_PATTERN)
    """An earlier effect step whose action this one compensates (recorded in its ActionRecord)."""


LEAF_STEP_KINDS = ("read", "ask", "await", "effect", "complete")
STEP_KINDS = (*LEAF_STEP_KINDS, "child")


def _exactly_one(kinds: tuple[str, ...]) -> ConfigDict:
    return ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in kinds) + " == 1",
                    "exactly one of " + ", ".join(kinds) + " must be set in a step",
                )
            ]
        }
    )


class LeafStep(ApiModel):
    """A step of a child run: any step kind except ``child`` (CRD schemas cannot recurse)."""

    model_config = _exactly_one(LEAF_STEP_KINDS)

    name: str = Field(max_length=63, pattern=NAME_PATTERN)
    """The step's name, unique in the run: part of request IDs, idempotency keys and child names."""
    read: ReadStep | None = None
    """Read a Kubernetes object as evidence."""
    ask: AskStep | None = None
    """Ask a person a question and wait for the answer (waiting_input)."""
    await_: AwaitStep | None = Field(default=None, alias="await")
    """Wait for an external event (waiting_external)."""
    effect: EffectStep | None = None
    """Perform a side effect through the action ledger."""
    complete: CompleteStep | None = None
    """Finish the run (completed) with a result."""


class ChildStep(ApiModel):
    """Start a child AgentRun and wait (in waiting_external) for its terminal outcome.

    The child is named ``<parent>-<step>``, owned by the parent (garbage-collected with it), carries
    ``spec.parentRef`` and inherits the parent's ServiceAccount and policy. It is created AS the
    parent's ServiceAccount, so a run may only start children if that account may create AgentRuns.
    """

    task_type: str = Field(max_length=63, pattern=NAME_PATTERN)
    """The child run's spec.taskType."""
    objective: str = Field(max_length=4096)
    """The child run's spec.objective."""
    steps: list[LeafStep] = Field(default_factory=list, max_length=16)
    """The child run's steps (no child steps: a child has no children of its own here)."""
    expires_in: str | None = Field(
        default=None, max_length=32, pattern=DURATION_PATTERN, json_schema_extra=bounded_duration("expiresIn")
    )
    """Accepted but not acted on by this release: the parent waits for its child without expiry
    (a deadline on the parent bounds it, and the child inherits that deadline)."""


class Step(LeafStep):
    """One scripted step: exactly one of the step kinds is set."""

    model_config = _exactly_one(STEP_KINDS)

    child: ChildStep | None = None
    """Start a child AgentRun and wait for its outcome (waiting_external)."""
