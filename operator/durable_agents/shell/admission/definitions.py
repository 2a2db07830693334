"""The admission webhook's rules for Agents and ModelConfigs: their deletion while runs use them.

The same rule as AgentPolicies' (:mod:`durable_agents.shell.admission.policy_integrity`, reused):

- UPDATE: setting (or changing) the annotation ``durable-agents.io/force-delete`` needs the custom
  verb ``force-delete`` on the object (a SubjectAccessReview), and is stamped by the webhook.
- DELETE: refused while non-terminal runs use it, naming up to 10 and the total, unless it carries
  a stamped force-delete mark. A forced deletion changes nothing for runs that pinned it: the
  deletion is a change of their definition, ruled by their policy's freshness.definitionChanged
  (keep: they go on with the pinned content; reapprove or fail: they fail, saying so). A run that
  did not pin yet waits for its Agent (``waitingFor: agent:NAME``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import AGENT_PLURAL, GROUP, MODEL_CONFIG_PLURAL, VERSION, Identity
from durable_agents.core.definitions import definition_users, sub_agent_cycle
from durable_agents.core.policy_integrity import deletion_refusal, force_reason, force_unproven
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.policy_integrity import check_mark
from durable_agents.shell.ground.kube import Kube

PLURALS = {"Agent": AGENT_PLURAL, "ModelConfig": MODEL_CONFIG_PLURAL}
DEFINITION_PATH = "validate-definition"
DEFINITION_STAMP_PATH = "stamp-definition"


async def check_definition(
    kube: Kube,
    operation: str,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    user: Identity,
    keyring: Keyring,
) -> str | None:
    """Why this Agent or ModelConfig write or delete must be refused, or None (an Agent's creation:
    only a cycle of sub-agent calls)."""
    if operation == "DELETE":
        return await _check_delete(kube, old, keyring) if old is not None else None
    if new is None:
        return None
    cycle = await _check_cycle(kube, new) if new.get("kind") == "Agent" else None
    if cycle is not None or operation == "CREATE":
        return cycle
    return await check_mark(kube, new, old, user, keyring, PLURALS.get(str(new.get("kind")), AGENT_PLURAL))


async def _check_cycle(kube: Kube, new: Mapping[str, Any]) -> str | None:
    """An Agent whose sub-agents call it back (A calls B calls A), directly or further down, is
    refused naming the field and the cycle (the Agents of its namespace as they are now; a run
    would refuse the call that closes it anyway: SubAgentCycle)."""
    meta, spec = new.get("metadata") or {}, new.get("spec") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    own = [str(sub.get("agentRef")) for sub in spec.get("subAgents") or [] if isinstance(sub, Mapping)]
    if not own:
        return None
    try:
        found = await kube.call(
            kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, AGENT_PLURAL
        )
    except ApiException as err:
        return f"Agent {namespace}/{name}: could not list the Agents its subAgents name ({err.reason})"
    calls: dict[str, list[str]] = {
        str(a["metadata"]["name"]): [
            str(sub.get("agentRef")) for sub in (a.get("spec") or {}).get("subAgents") or []
        ]
        for a in found.get("items") or []
    }
    calls[name] = own
    cycle = sub_agent_cycle(name, calls)
    if cycle is None:
        return None
    index = own.index(cycle[1])
    return (
        f"spec.subAgents[{index}].agentRef: Agent {cycle[1]!r} makes a cycle of sub-agent calls "
        f"({' → '.join(cycle)}): a run would refuse the call that closes it"
    )


async def _check_delete(kube: Kube, old: Mapping[str, Any], keyring: Keyring) -> str | None:
    kind = str(old.get("kind") or "Agent")
    meta = old.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if force_reason(old) is not None and force_unproven(keyring, old) is None:
        return None  # marked by someone with force-delete: its runs keep what they pinned
    custom = kube.custom
    try:
        listed = await kube.call(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns")
        agents: list[str] = []
        if kind == "ModelConfig":
            found = await kube.call(
                custom.list_namespaced_custom_object, GROUP, VERSION, namespace, AGENT_PLURAL
            )
            agents = [
                str(a["metadata"]["name"])
                for a in found.get("items") or []
                if (a.get("spec") or {}).get("modelRef") == name
            ]
    except ApiException as err:
        return f"{kind} {namespace}/{name}: could not list the runs that may use it ({err.reason})"
    users = definition_users(listed.get("items") or [], kind, name, agents)
    return deletion_refusal(
        namespace,
        name,
        users,
        kind=kind,
        plural=PLURALS.get(kind, AGENT_PLURAL),
        then="leave them to their policy's freshness.definitionChanged",
    )
