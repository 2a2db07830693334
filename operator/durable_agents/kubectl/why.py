"""``kubectl agentrun why RUN [-n NS] [-o json|yaml]``: why a run waits, and what would move it.

It prints what the run waits for, what would wake it (the answer, approval, event, retry time or
reconciliation, with the exact kubectl command), when the wait expires by itself, which transition
moved it last (event, from -> to, when, by which holder, at which state version), and its
``Stuck`` condition with the fix (set by the operator's stuck check,
:mod:`durable_agents.shell.runs.stuck`). Read-only: one read of the run (and, while it waits for an
action, of its ActionRecords). Exit 0; 1 when the API server refuses or the run is not there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentRunSpec, AgentRunStatus
from durable_agents.core.definitions import DEFINITION_CHANGED
from durable_agents.core.inbox import answer_command, decide_command
from durable_agents.core.policy_resolution import POLICY_AMBIGUOUS, POLICY_MANDATORY, POLICY_REQUIRED
from durable_agents.core.stuck import STUCK, wait_expiry
from durable_agents.kubectl.errors import api_message
from durable_agents.kubectl.reconcile import unknown_actions


class WhyError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


def _unknown_actions(api: client.CustomObjectsApi, ns: str, run: str) -> list[str] | None:
    """The run's ActionRecords whose outcome is unknown; None when they cannot be listed."""
    try:
        return unknown_actions(api, ns, run)
    except ApiException:
        return None


def _approval_wake(name: str, ns: str, request: dict[str, Any]) -> dict[str, Any]:
    """A decision on the pending request: the pinned commands (its ID and digest)."""
    role = request.get("approverRole", "approve on agentruns")
    return {
        "what": f"a decision on approval request {request.get('requestId')} ({request.get('effect')})"
        f" by someone with verb {role}",
        "commands": [
            decide_command(name, ns, request, decision)
            for decision in request.get("allowedDecisions") or ["approve", "reject"]
        ],
    }


def wakes(run: dict[str, Any], unknown: list[str] | None = None) -> list[dict[str, Any]]:
    """What would move the run on: one entry per way, each with the commands that do it."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    ref = f"{name} -n {ns}"
    state = status.get("state") or "pending"
    kind, _, what = (status.get("waitingFor") or "").partition(":")
    patch = f"kubectl patch agentrun {ref} --type merge -p"
    if state in ("completed", "failed", "canceled", "expired"):
        outcome = status.get("outcome") or {}
        if outcome.get("reason") == POLICY_REQUIRED:
            return _policy_required(name, ns)
        return [{"what": f"nothing: the run has ended ({outcome.get('reason', state)})", "commands": []}]
    if state == "quarantined":
        return [{"what": "a retry, once the cause is fixed", "commands": [f"kubectl agentrun retry {ref}"]}]
    if state == "waiting_approval":
        return [_approval_wake(name, ns, status.get("approvalRequest") or {})]
    if kind == "input":
        body = json.dumps({"spec": {"answers": {what: "<answer>"}}})
        commands = [answer_command(name, ns, what), f"{patch} '{body}'"]
        return [{"what": f"an answer to question {what} (verb answer)", "commands": commands}]
    if kind == "event":
        body = json.dumps({"spec": {"events": {what: "<payload>"}}})
        commands = [f"kubectl agentrun answer {ref} '<payload>'", f"{patch} '{body}'"]
        return [{"what": f"the external event {what} (verb answer)", "commands": commands}]
    if kind == "retry" or state == "waiting_retry":
        retry = (status.get("checkpoint") or {}).get("retry") or {}
        failed = f"; the last attempt failed: {retry['lastFailure']}" if retry.get("lastFailure") else ""
        return [
            {
                "what": f"the retry time {status.get('retryAt') or what}: the operator retries then{failed}",
                "commands": [],
            }
        ]
    if kind == "action":
        out: list[dict[str, Any]] = [
            {"what": f"the outcome of action(s) {what}: the operator asks their system", "commands": []}
        ]
        for action in unknown or []:
            out.append(
                {
                    "what": f"action {action}'s outcome is unknown: someone who can look says whether it"
                    " happened (the policy's approver verb)",
                    "commands": [
                        f"kubectl agentrun reconcile {ref} --action {action} --applied|--not-applied"
                    ],
                }
            )
        return out
    if kind == "child":
        return [
            {"what": f"its child run {what} ending", "commands": [f"kubectl agentrun why {what} -n {ns}"]}
        ]
    if kind == "agentpolicy" and what in (POLICY_AMBIGUOUS, POLICY_MANDATORY):
        return _policy_conflict(what, ns)
    if kind == "clusteragentpolicy":
        return [
            {
                "what": f"its ClusterAgentPolicy {what}",
                "commands": [f"kubectl apply -f <ClusterAgentPolicy {what}>"],
            }
        ]
    if kind == "agentpolicy":
        return [
            {
                "what": f"its AgentPolicy {what}",
                "commands": [f"kubectl apply -n {ns} -f <AgentPolicy {what}>"],
            }
        ]
    return [{"what": f"nothing from you: the operator is working on it ({state})", "commands": []}]


def _policy_required(name: str, ns: str) -> list[dict[str, Any]]:
    """A run no policy governed ended at its first action that was not read-only: the fix."""
    return [
        {
            "what": "a policy to govern it (nothing was sent: no policy governed this run, so it could "
            "only read): give the namespace a default AgentPolicy (spec.default: true), or the cluster "
            "a default ClusterAgentPolicy, or name one in spec.policyRef (verb use on it); then create "
            "the run again",
            "commands": [
                f"kubectl get agentpolicies -n {ns}",
                "kubectl get clusteragentpolicies",
                f"kubectl auth can-i use agentpolicies/<name> -n {ns}",
                f"kubectl get agentrun {name} -n {ns} -o yaml > run.yaml  # name a policy, re-create",
            ],
        }
    ]


def _policy_conflict(reason: str, ns: str) -> list[dict[str, Any]]:
    if reason == POLICY_MANDATORY:
        what = (
            f"nothing while namespace {ns}'s default AgentPolicy is mandatory: this run names another "
            "policy; create it again without spec.policyRef"
        )
    else:
        what = "one default left: two policies of its scope say spec.default: true; unset it on one"
    return [
        {
            "what": what,
            "commands": [
                f"kubectl get agentpolicies -n {ns}  # the Default column",
                "kubectl get clusteragentpolicies  # the Default column",
            ],
        }
    ]


def explain(run: dict[str, Any], unknown: list[str] | None = None) -> dict[str, Any]:
    """The answer as data (``-o json|yaml``; the text form prints the same)."""
    meta, raw = run.get("metadata") or {}, run.get("status") or {}
    expires: datetime | None = None
    with contextlib.suppress(ValidationError):
        expires = wait_expiry(
            AgentRunSpec.model_validate(run.get("spec") or {}), AgentRunStatus.model_validate(raw)
        )
    history = raw.get("history") or []
    last = history[-1] if history else None
    stuck = next((c for c in raw.get("conditions") or [] if c.get("type") == STUCK), None)
    return {
        "definition": _definition(run),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "state": raw.get("state") or "pending",
        "since": raw.get("stateSince"),
        "waitingFor": raw.get("waitingFor"),
        "wakeBy": wakes(run, unknown),
        "expiresAt": expires.isoformat() if expires is not None and not _ended(raw) else None,
        "lastTransition": None
        if last is None
        else {
            k: last.get(k) for k in ("stateVersion", "event", "from", "to", "at", "holder", "epoch", "detail")
        },
        "stuck": None
        if stuck is None
        else {k: stuck.get(k) for k in ("status", "reason", "message", "lastTransitionTime")},
    }


def _definition(run: dict[str, Any]) -> dict[str, Any] | None:
    """A run of an Agent: the definition it pinned and what a change of it did (DefinitionChanged)."""
    name = (run.get("spec") or {}).get("agentRef")
    if not name:
        return None
    raw = run.get("status") or {}
    pinned = (raw.get("checkpoint") or {}).get("definition") or {}
    changed = next((c for c in raw.get("conditions") or [] if c.get("type") == DEFINITION_CHANGED), None)
    message = changed.get("message") if changed else None
    history = raw.get("history") or []
    if message is None:  # reapprove and fail say it in the transition that applied them
        message = next(
            (h.get("detail") for h in reversed(history) if "(policy: " in (h.get("detail") or "")), None
        )
    if message is None and (raw.get("outcome") or {}).get("reason") in (
        "DefinitionChanged",
        "DefinitionUnusable",
    ):
        message = raw["outcome"].get("message")
    return {
        "agentRef": name,
        "pinned": pinned.get("digest"),
        "approvedUnder": pinned.get("approvedUnder"),
        "changed": message,
    }


def _ended(status: dict[str, Any]) -> bool:
    return status.get("state") in ("completed", "failed", "canceled", "expired")


def _ago(at: str | None, now: datetime) -> str:
    if not at:
        return ""
    with contextlib.suppress(ValueError):
        seconds = int((now - datetime.fromisoformat(at.replace("Z", "+00:00"))).total_seconds())
        when = "ago" if seconds >= 0 else "from now"
        seconds = abs(seconds)
        span = (
            f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
            if seconds >= 3600
            else f"{seconds // 60}m{seconds % 60:02d}s"
        )
        return f" ({span} {when})"
    return ""


def text(answer: dict[str, Any], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    lines = [
        f"AgentRun:         {answer['namespace']}/{answer['name']}",
        f"State:            {answer['state']}"
        + (f" since {answer['since']}{_ago(answer['since'], now)}" if answer["since"] else ""),
        f"Waiting for:      {answer['waitingFor'] or '-'}",
        "Wakes it:",
    ]
    for way in answer["wakeBy"]:
        lines.append(f"  - {way['what']}")
        lines += [f"      {command}" for command in way["commands"]]
    expires = answer["expiresAt"]
    if _ended({"state": answer["state"]}):
        lines.append("Expires:          -")
    else:
        lines.append(
            f"Expires:          {expires}{_ago(expires, now)}"
            if expires
            else "Expires:          never (no expiry, no deadline)"
        )
    last = answer["lastTransition"]
    if last is None:
        lines.append("Last transition:  none yet")
    else:
        holder = f" by {last['holder']}" + (
            f" (epoch {last['epoch']})" if last.get("epoch") is not None else ""
        )
        lines.append(
            f"Last transition:  {last['event']} {last['from']} -> {last['to']} at {last['at']}"
            f"{holder if last.get('holder') else ''}, stateVersion {last['stateVersion']}"
        )
    definition = answer.get("definition")
    if definition is not None:
        pinned = definition["pinned"] or "not yet (pinned at acceptance)"
        lines.append(f"Agent:            {definition['agentRef']}, pinned {pinned}")
        if definition.get("approvedUnder"):
            lines.append(f"  re-approved under {definition['approvedUnder']}")
        if definition.get("changed"):
            lines.append(f"  definition changed: {definition['changed']}")
    stuck = answer["stuck"]
    if stuck is None or stuck.get("status") != "True":
        lines.append("Stuck:            no")
    else:
        lines.append(f"Stuck:            {stuck['reason']} since {stuck['lastTransitionTime']}")
        lines.append(f"  fix: {stuck['message']}")
    return "\n".join(lines)


def why(api: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    try:
        run: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)
    except ApiException as err:
        if err.status == 404:
            raise WhyError(f"agentrun {name!r} not found in namespace {ns!r}") from None
        raise WhyError(
            f"the API server refused to read agentrun {ns}/{name}: {err.status} {api_message(err)}"
        ) from None
    waiting_for = (run.get("status") or {}).get("waitingFor") or ""
    unknown = _unknown_actions(api, ns, name) if waiting_for.startswith("action:") else None
    return explain(run, unknown)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubectl agentrun why", description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
        answer = why(client.CustomObjectsApi(), ns, args.name)
    except (WhyError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(answer, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(answer, sort_keys=False), end="")
    else:
        print(text(answer))
    return 0
