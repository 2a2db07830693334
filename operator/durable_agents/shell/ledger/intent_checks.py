"""Whether an ActionRecord is its run's committed intent, read fresh from the API server.

Only the run's own intents are sent: the run (``spec.runRef``) must exist and its committed
checkpoint, verified by its integrity stamp, must hold exactly this intent, as the engine would
make it now under the approval rules of the run's policy
(:func:`~durable_agents.core.engine.actions.intent_refusal`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import ActionRecordSpec
from durable_agents.core.destinations import effect_refusal
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.engine.actions import PolicyUnknown, Refused, Unverified, intent_refusal
from durable_agents.core.policy_resolution import Resolved
from durable_agents.shell.agent.resolver import AgentResolver
from durable_agents.shell.ground.store import Gone, RunStore
from durable_agents.shell.intake.policies import PolicyCache

Verdict = Refused | Unverified | None
DESTINATION_NOT_ALLOWED = "DestinationNotAllowed"


def target_refusal(namespace: str, spec: ActionRecordSpec, settings: Settings) -> str | None:
    """Why this record's target names a URL its run's policy does not allow now, or None."""
    if settings.policy is None:
        return None
    source = f"AgentPolicy {namespace}/{settings.policy_name}"
    return effect_refusal(source, settings.policy, spec.effect, spec.target, "ActionRecord spec.target")


async def check_intent(
    body: dict[str, Any],
    spec: ActionRecordSpec,
    runs: RunStore,
    policies: PolicyCache,
    agents: AgentResolver,
    settings: Settings,
) -> tuple[Verdict, dict[str, Any] | None]:
    """Whether this record is its run's committed intent (None), and the run as read (None when
    it is gone). ``settings``: the operator's, before the run's policy."""
    namespace = body["metadata"]["namespace"]
    try:
        run_body = await runs.get(namespace, spec.run_ref.name)
    except Gone:
        return intent_refusal(None, body["metadata"]["name"], spec, None, settings), None
    try:
        run = RunSnapshot.from_object(run_body)
    except (ValidationError, KeyError) as err:
        return Refused(f"its run {spec.run_ref.name!r} cannot be read: {err}"[:1024]), run_body
    found = policies.governing(run)
    if isinstance(found, Resolved):  # its approval rules: a fresh read, as the worker waits for it
        read = await policies.read(*found.key, fresh=True)
        if read is None:  # never sent without its policy: held until the policy is usable again
            why = f"its run's {found.describe()} is missing or not usable"
            return Unverified(PolicyUnknown("PolicyMissing", why)), run_body
        settings = policies.settings_for(run, settings, read)
    else:  # no policy governs the run (or its scope's policies contradict): read-only work only
        settings = policies.settings_for(run, settings)
    problem = target_refusal(namespace, spec, settings)
    if problem is not None:  # where it would land: the policy's allowlist, now (the second line)
        return Refused(problem, reason=DESTINATION_NOT_ALLOWED), run_body
    # A model run's pending call is rebuilt from its tools (MCP servers listed) and the
    # checkpoint's sealed arguments; inputs that cannot be resolved send nothing.
    await agents.prepare(run, settings)
    planner = agents.planner_for(run)
    return intent_refusal(run, body["metadata"]["name"], spec, planner, settings), run_body


async def query_refusal(
    body: dict[str, Any], spec: ActionRecordSpec, run_body: dict[str, Any] | None, policies: PolicyCache
) -> str | None:
    """Why a reconciliation query of this record may not be sent now (its target is outside its
    run's policy's allowlist), or None. Without its run the record's own target is all there is."""
    if run_body is None:
        return None
    try:
        run = RunSnapshot.from_object(run_body)
    except (ValidationError, KeyError):
        return None  # the query path keeps asking as before; the dispatch path refuses such a run
    if run.spec.policy_ref is None:
        return None
    namespace = body["metadata"]["namespace"]
    policy = await policies.read(namespace, run.spec.policy_ref.name, fresh=True)
    settings = Settings(policy_name=run.spec.policy_ref.name, policy=policy)
    return target_refusal(namespace, spec, settings)
