"""The admission webhook's rules for RegionFailovers (served by the same webhook as AgentRuns).

- Identity and stamp (mutating, CREATE): ``spec.requestedBy`` is the request's authenticated
  user, ``spec.requestedAt`` now, and ``spec.stamp`` the operator's stamp over the object's name
  and spec (:func:`durable_agents.core.authority.stamp_failover`). Whatever a client wrote there
  is overwritten.
- Authority (validating, CREATE): a SubjectAccessReview for verb ``failover`` on the resource
  ``regions`` of group durable-agents.io, resource name FROM, cluster-wide. ``regions`` is no
  stored resource: it exists for RBAC, so a region's failover is granted per region name.
- The stamp (validating, CREATE): it must verify for the final name, so a request sent with
  ``generateName`` (its name is not known when it is stamped) is refused, saying so.
- Immutable (validating, UPDATE): the spec never changes (the CRD's rule says the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import GROUP, Identity, RegionFailoverSpec
from durable_agents.core.authority import failover_unproven, instant, stamp_failover
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.authority import MUTATE_FAILOVER_PATH, VALIDATE_FAILOVER_PATH, may
from durable_agents.shell.ground.kube import Kube

__all__ = ["MUTATE_FAILOVER_PATH", "VALIDATE_FAILOVER_PATH", "check_failover", "failover_stamps"]

FAILOVER_VERB = "failover"
REGIONS = "regions"


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str((meta.get("name") if isinstance(meta, Mapping) else None) or "")


def failover_stamps(
    operation: str, new: Mapping[str, Any], user: Identity, now: datetime, keyring: Keyring
) -> dict[str, Any]:
    """The spec fields to overwrite (a merge into ``spec``): on CREATE, who asked, when, and the
    stamp. Nothing on UPDATE (the spec is immutable), nor for a spec the schema will refuse."""
    if operation != "CREATE":
        return {}
    asked = {
        **_spec(new),
        "requestedBy": {**user.wire(), "uid": user.uid},  # a client's uid never survives the merge
        "requestedAt": instant(now),
    }
    try:
        spec = RegionFailoverSpec.model_validate(asked)
    except ValidationError:
        return {"requestedBy": asked["requestedBy"], "requestedAt": asked["requestedAt"], "stamp": None}
    return {
        "requestedBy": asked["requestedBy"],
        "requestedAt": asked["requestedAt"],
        "stamp": stamp_failover(keyring, _name(new), spec),
    }


def failover_denied(user: Identity, region: str) -> str:
    """A refusal that names the missing verb and how to grant it."""
    rule = (
        f"{{apiGroups: [{GROUP}], resources: [{REGIONS}], verbs: [{FAILOVER_VERB}], "
        f"resourceNames: [{region}]}}"
    )
    return (
        f"user {user.username!r} may not failover region {region!r}: needs RBAC verb {FAILOVER_VERB!r} "
        f"on resource {REGIONS!r} in API group {GROUP!r} (resource name {region!r}), granted "
        f"cluster-wide: a ClusterRole with the rule {rule} bound by a ClusterRoleBinding (the chart's "
        "<release>-durable-agents-region-failover ClusterRole grants it for every region)"
    )


async def check_failover(
    kube: Kube,
    operation: str,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    keyring: Keyring,
) -> str | None:
    """Why this RegionFailover write must be refused, or None."""
    if operation == "UPDATE":
        if _spec(new) != _spec(old):
            return "spec is immutable: a region failover request is never changed; create a new one"
        return None
    if operation != "CREATE":
        return None
    spec = RegionFailoverSpec.model_validate(_spec(new))  # the schema has already checked it
    try:
        allowed = await may(
            kube, user, verb=FAILOVER_VERB, resource=REGIONS, namespace="", name=spec.from_region
        )
    except ApiException as err:
        region = spec.from_region
        return f"could not check whether {user.username!r} may failover region {region!r}: {err.reason}"
    if not allowed:
        return failover_denied(user, spec.from_region)
    name = _name(new)
    by = spec.requested_by
    problem = failover_unproven(keyring, name, spec)
    if by is None or by.username != user.username or problem is not None:
        return (
            f"region failover {name!r} is not stamped by the admission webhook for {user.username!r}: "
            "name the failover (with generateName its name is not known when it is stamped)"
        )
    return None
