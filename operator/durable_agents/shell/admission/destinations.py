"""Admission of where a new run may send: every destination its spec names (effect targets,
MCP servers, the model endpoint) must be allowed by its policy's ``spec.destinations``
(:mod:`durable_agents.core.destinations`); a policy's entries must parse, and its own
``spec.notifications`` targets must be allowed by its ``spec.destinations.notifications``.

The policy is read fresh from the API server (a cached copy could be older than a narrowing).
A policy that does not exist yet lets the run in: it waits for its policy, and the worker and the
dispatcher check the destinations again before every send (the second line).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.core.destinations import (
    Allowlist,
    entry_problems,
    of_policy,
    refusal,
    run_refusal,
)
from durable_agents.shell.intake.policies import PolicyCache


async def check_run_destinations(new: Mapping[str, Any], policies: PolicyCache) -> str | None:
    """Why this new run names a destination its policy does not allow (the field named), or None."""
    spec = new.get("spec") or {}
    ref = spec.get("policyRef") or {}
    name = ref.get("name") if isinstance(ref, Mapping) else None
    if not name:
        return None
    namespace = str((new.get("metadata") or {}).get("namespace") or "")
    try:
        policy = await policies.read(namespace, str(name), fresh=True)
    except ApiException as err:  # fail closed, saying why: nothing is admitted unchecked
        return f"could not read AgentPolicy {namespace}/{name} to check spec.destinations: {err.reason}"
    if policy is None:
        return None
    return run_refusal(spec, [of_policy(f"AgentPolicy {namespace}/{name}", policy)])


def policy_entry_refusal(new: Mapping[str, Any] | None) -> str | None:
    """Why a policy's ``spec.destinations`` holds an entry that does not parse, or None."""
    if new is None:
        return None
    problems = entry_problems((new.get("spec") or {}).get("destinations"), "spec.destinations")
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}: an allowlist entry is a URL prefix http(s)://host[:port][/path]"


def policy_notification_refusal(new: Mapping[str, Any] | None) -> str | None:
    """Why a policy names a notification target its own ``spec.destinations.notifications`` does
    not allow (the field named), or None. The notifier checks again before every send."""
    if new is None:
        return None
    spec = new.get("spec") or {}
    allowed = (spec.get("destinations") or {}).get("notifications")
    if allowed is None:
        return None
    lists = [Allowlist("spec.destinations.notifications", tuple(str(entry) for entry in allowed))]
    for index, target in enumerate(spec.get("notifications") or []):
        url = target.get("url") if isinstance(target, Mapping) else None
        problem = refusal(url, lists, f"spec.notifications[{index}].url")
        if problem is not None:
            return problem
    return None
