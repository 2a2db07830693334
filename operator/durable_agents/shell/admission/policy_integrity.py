"""The admission webhook's integrity and deletion rules for AgentPolicies
(:mod:`durable_agents.core.policy_integrity`), called from ``check_policy``.

- CREATE / UPDATE: a version already seen with other content is refused, naming ``spec.version``
  (seen: the old object's own version and its ``status.versions``, and what this process's
  policy cache saw under the name). Re-applying the same content is accepted (and, the object
  being unchanged, the API server writes nothing).
- Setting (or changing) the annotation ``durable-agents.io/force-delete`` needs the custom verb
  ``force-delete`` on the policy (a SubjectAccessReview).
- DELETE: refused while non-terminal runs use the policy, naming up to 10 and the total, unless
  it carries the force-delete annotation (its runs are then quarantined ``PolicyDeleted``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import Identity
from durable_agents.core.policy_integrity import (
    FORCE_DELETE,
    FORCE_DELETE_VERB,
    STAMPED_MARKS,
    annotation,
    deletion_refusal,
    force_reason,
    force_unproven,
    history_of,
    identity_of,
    version_conflict,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.authority import refused_verb
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.intake.policies import PolicyCache


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


async def check_integrity(
    kube: Kube,
    operation: str,
    new: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    user: Identity,
    policies: PolicyCache,
    keyring: Keyring,
) -> str | None:
    """Why this AgentPolicy create, update or delete must be refused, or None."""
    if operation == "DELETE":
        return await _check_delete(old, policies, keyring) if old is not None else None
    if new is None:
        return None
    namespace, name = _key(new)
    identity = identity_of(new)
    if identity is not None:
        histories = [policies.seen_versions((namespace, name))]
        if old is not None:
            histories = [history_of(old), *histories]
            own = identity_of(old)
            if own is not None:  # status.versions may lag behind the object itself
                histories.insert(0, {own.version: own.digest})
        conflict = version_conflict(name, identity, *histories)
        if conflict is not None:
            return conflict
    return await check_mark(kube, new, old, user, keyring)


async def check_mark(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    keyring: Keyring,
    plural: str = "agentpolicies",
) -> str | None:
    """A new force-delete mark (on a policy, or an Agent or ModelConfig: ``plural``) needs the
    verb and carries this user's stamp; the stamp's annotations are the webhook's, never written
    by hand."""
    namespace, name = _key(new)
    field = f"metadata.annotations[{FORCE_DELETE!r}]"
    marked = force_reason(new)
    if marked is not None and marked != force_reason(old):
        refused = await refused_verb(kube, user, FORCE_DELETE_VERB, plural, namespace, name)
        if refused is not None:
            return f"{refused} ({field})"
        if annotation(new, STAMPED_MARKS[0]) != user.username or force_unproven(keyring, new) is not None:
            return f"{field} is not stamped by the admission webhook for {user.username!r}"
        return None
    for key in STAMPED_MARKS:
        if annotation(new, key) not in (None, annotation(old, key)):
            by_hand = f"is written by the admission webhook with {field}, never by hand"
            return f"metadata.annotations[{key!r}] {by_hand}"
    return None


async def _check_delete(old: Mapping[str, Any], policies: PolicyCache, keyring: Keyring) -> str | None:
    namespace, name = _key(old)
    if force_reason(old) is not None and force_unproven(keyring, old) is None:
        return None  # marked by someone with force-delete: its runs are quarantined
    try:
        users = await policies.users(namespace, name)
    except ApiException as err:
        return f"AgentPolicy {namespace}/{name}: could not list the runs that may use it ({err.reason})"
    return deletion_refusal(namespace, name, users)
