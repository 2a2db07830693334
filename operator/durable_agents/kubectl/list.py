"""``kubectl agentrun list``: the queue of runs, for the person on call.

    kubectl agentrun list [-n NS | -A] [--state S ...] [--region R] [--waiting-longer-than 10m]
                          [--stuck] [--escalated] [-o wide|json|yaml]

Sorted by the time each run has been in its current state, oldest first: the run that has waited
longest is on top. Columns as ``kubectl get`` prints them (NAMESPACE with ``-A``); ``-o wide``
adds the state version, the policy, the last holder (the replica whose commit moved it) and the
reason (the outcome's, else the Stuck condition's); ``-o json|yaml`` prints a kubectl-style
List of the runs as stored. Reading the queue needs verb ``list`` on agentruns; a refusal names
it. No runs: "No resources found in NS namespace." on stderr, exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.kubectl.errors import api_message

STATES = [state.value for state in RunState]
_FORBIDDEN_USER = re.compile(r'[Uu]ser "([^"]*)" cannot')


def refusal(err: ApiException, verb: str, resource: str, namespace: str | None, also: str = "") -> str:
    """The API server's refusal said for people: which verb is missing, for whom, where."""
    said = api_message(err)
    if err.status != 403:
        return f"error: {err.status} {err.reason}: {said}"
    found = _FORBIDDEN_USER.search(said)
    user = f"user {found.group(1)!r}" if found else "you"
    where = f" in namespace {namespace!r}" if namespace else " in any namespace"
    return (
        f"error: {user} may not {verb} {resource}{where}: needs verb {verb!r} on resource "
        f"'agentruns' in API group {GROUP!r}{also} (the API server said: {said})"
    )


def human_duration(age: timedelta) -> str:
    """An age as kubectl prints one (``kubectl get``'s AGE column)."""
    seconds = max(0, int(age.total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def _condition(run: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    conditions = (run.get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == ctype), None)
    return found if found is not None and found.get("status") == "True" else None


def state_of(run: Mapping[str, Any]) -> str:
    return str((run.get("status") or {}).get("state") or RunState.PENDING.value)


def in_state_since(run: Mapping[str, Any]) -> datetime | None:
    status = run.get("status") or {}
    return _time(status.get("stateSince")) or _time((run.get("metadata") or {}).get("creationTimestamp"))


def region_of(run: Mapping[str, Any]) -> str:
    owning = ((run.get("status") or {}).get("ownership") or {}).get("region")
    return str(owning or (run.get("spec") or {}).get("region") or "-")


def stuck_reason(run: Mapping[str, Any]) -> str:
    stuck = _condition(run, "Stuck")
    return str(stuck.get("reason") or "True") if stuck is not None else "-"


def _holder(run: Mapping[str, Any]) -> str:
    history = (run.get("status") or {}).get("history") or []
    return str((history[-1] or {}).get("holder") or "-") if history else "-"


def _reason(run: Mapping[str, Any]) -> str:
    outcome = (run.get("status") or {}).get("outcome") or {}
    stuck = _condition(run, "Stuck")
    return str(outcome.get("reason") or (stuck or {}).get("reason") or "-")


def selected(runs: list[dict[str, Any]], args: argparse.Namespace, now: datetime) -> list[dict[str, Any]]:
    """The runs the filters keep, the longest in their state first."""
    longer = args.waiting_longer_than
    kept = []
    for run in runs:
        state = state_of(run)
        since = in_state_since(run) or now
        if args.state and state not in args.state:
            continue
        if args.region and region_of(run) != args.region:
            continue
        waiting = state in STATES and RunState(state).waiting
        if longer is not None and not (waiting and now - since >= longer):
            continue
        if args.stuck and _condition(run, "Stuck") is None:
            continue
        if args.escalated and _condition(run, "Escalated") is None:
            continue
        kept.append(run)
    return sorted(kept, key=lambda run: (in_state_since(run) or now, run["metadata"]["name"]))


def table(runs: list[dict[str, Any]], *, all_namespaces: bool, wide: bool, now: datetime) -> str:
    header = ["NAME", "STATE", "WAITING FOR", "AGE IN STATE", "REGION", "STUCK"]
    if wide:
        header += ["ESCALATED", "VERSION", "POLICY", "HOLDER", "REASON"]
    rows = [["NAMESPACE", *header] if all_namespaces else header]
    for run in runs:
        status, spec, meta = run.get("status") or {}, run.get("spec") or {}, run["metadata"]
        row = [
            meta["name"],
            state_of(run),
            str(status.get("waitingFor") or "-"),
            human_duration(now - (in_state_since(run) or now)),
            region_of(run),
            stuck_reason(run),
        ]
        if wide:
            escalated = "True" if _condition(run, "Escalated") is not None else "-"
            policy = str((spec.get("policyRef") or {}).get("name") or "-")
            row += [escalated, str(status.get("stateVersion", 0)), policy, _holder(run), _reason(run)]
        rows.append([meta.get("namespace", ""), *row] if all_namespaces else row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "   ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def as_list(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": runs, "metadata": {"resourceVersion": ""}}


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except InvalidDuration as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="kubectl agentrun list", description=__doc__.split("\n\n")[0])
    out.add_argument("--state", action="append", choices=STATES, help="keep runs in this state (repeatable)")
    out.add_argument("-n", "--namespace")
    out.add_argument("-A", "--all-namespaces", action="store_true")
    out.add_argument("--region", help="keep runs owned by this region")
    out.add_argument(
        "--waiting-longer-than", type=_duration, metavar="DURATION", help="runs waiting longer (e.g. 10m)"
    )
    out.add_argument("--stuck", action="store_true", help="runs with condition Stuck=True")
    out.add_argument("--escalated", action="store_true", help="runs with condition Escalated=True")
    out.add_argument("-o", "--output", choices=["wide", "json", "yaml"])
    out.add_argument("--kubeconfig")
    out.add_argument("--context")
    return out


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun list ...`` (``argv`` without the leading ``list``)."""
    args = parser().parse_args(argv)
    config.load_kube_config(config_file=args.kubeconfig, context=args.context)
    _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
    ns = (
        None
        if args.all_namespaces
        else args.namespace or (active or {}).get("context", {}).get("namespace", "default")
    )
    api = client.CustomObjectsApi()
    try:
        if ns is None:
            listed = api.list_cluster_custom_object(GROUP, VERSION, "agentruns")
        else:
            listed = api.list_namespaced_custom_object(GROUP, VERSION, ns, "agentruns")
    except ApiException as err:
        print(refusal(err, "list", "agentruns", ns), file=sys.stderr)
        return 1
    now = datetime.now(UTC)
    runs = selected(list(listed.get("items") or []), args, now)
    if args.output == "json":
        print(json.dumps(as_list(runs), indent=4))
    elif args.output == "yaml":
        print(yaml.safe_dump(as_list(runs), sort_keys=False), end="")
    elif not runs:
        print(f"No resources found in {ns} namespace." if ns else "No resources found", file=sys.stderr)
    else:
        print(table(runs, all_namespaces=ns is None, wide=args.output == "wide", now=now))
    return 0
