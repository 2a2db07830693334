"""``kubectl agentrun region failover FROM --to TO``: ask for a region's runs to move to another.

    kubectl agentrun region failover FROM --to TO [--reason TEXT] [--wait] [--timeout SECONDS]

Creates a RegionFailover (cluster-scoped) named ``failover-FROM-to-TO-<random>``. The operator's
admission webhook records who asked and when, stamps it, and refuses it unless a
SubjectAccessReview lets you ``failover`` the resource ``regions`` (group durable-agents.io)
named FROM; the operator serving TO verifies each run before adopting it. With ``--wait``, waits
(at most ``--timeout`` seconds) until the failover is Completed or Refused and prints what moved,
what did not and why, and the actions whose outcome is unknown.

Exit codes: 0 completed with every run adopted; 2 completed with runs left behind (not adopted);
1 refused, timed out, or any error.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import (
    API_VERSION,
    FAILOVER_KIND,
    FAILOVER_PLURAL,
    GROUP,
    VERSION,
    FailoverPhase,
    RegionFailoverStatus,
)
from durable_agents.core.regions import InvalidRegion, validate_region
from durable_agents.kubectl.errors import api_message

RESOURCE = f"regionfailover.{GROUP}"
DEFAULT_TIMEOUT = 300.0
# As the API server's generateName makes them (no vowels: no words), made here because the
# webhook's stamp covers the name, which the mutating webhook never sees for generateName.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_NAME_ATTEMPTS = 5
LEFT_BEHIND = 2


class FailoverError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


def failover_name(from_region: str, to: str) -> str:
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    return f"failover-{from_region}-to-{to}-{suffix}"


def failover_body(name: str, from_region: str, to: str, reason: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"from": from_region, "to": to}
    if reason:
        spec["reason"] = reason
    return {"apiVersion": API_VERSION, "kind": FAILOVER_KIND, "metadata": {"name": name}, "spec": spec}


def create(api: client.CustomObjectsApi, from_region: str, to: str, reason: str | None) -> dict[str, Any]:
    """The RegionFailover as the API server stored it (a new name if one is taken)."""
    for attempt in range(_NAME_ATTEMPTS):
        body = failover_body(failover_name(from_region, to), from_region, to, reason)
        try:
            made: dict[str, Any] = api.create_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, body)
        except ApiException as err:
            if err.status == 409 and attempt + 1 < _NAME_ATTEMPTS:
                continue  # the random name is taken: another one
            raise FailoverError(f"the API server refused the failover: {api_message(err)}") from None
        return made
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _status(obj: dict[str, Any]) -> RegionFailoverStatus:
    return RegionFailoverStatus.model_validate(obj.get("status") or {})


def _finished(obj: dict[str, Any]) -> bool:
    return bool(obj.get("status")) and _status(obj).finished


def wait_finished(api: client.CustomObjectsApi, name: str, timeout: float) -> dict[str, Any]:
    """The failover once Completed or Refused (watched, not polled), or as last seen when
    ``timeout`` seconds passed first."""
    deadline = time.monotonic() + timeout
    while True:
        obj: dict[str, Any] = api.get_cluster_custom_object(GROUP, VERSION, FAILOVER_PLURAL, name)
        remaining = deadline - time.monotonic()
        if _finished(obj) or remaining <= 0:
            return obj
        stream = watch.Watch().stream(
            api.list_cluster_custom_object,
            GROUP,
            VERSION,
            FAILOVER_PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=obj["metadata"]["resourceVersion"],
            timeout_seconds=max(1, int(remaining)),
        )
        try:
            for event in stream:
                if event.get("type") == "DELETED":
                    raise FailoverError(f"{RESOURCE}/{name} was deleted while waiting for it")
                seen = event.get("object")
                if event.get("type") == "MODIFIED" and isinstance(seen, dict) and _finished(seen):
                    return seen
                if time.monotonic() > deadline:
                    break
        except ApiException as err:
            if err.status != 410:  # 410: the resourceVersion is too old; read it again
                raise


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return [
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in (headers, *rows)
    ]


def report(obj: dict[str, Any]) -> tuple[str, int]:
    """What a finished failover did, for people, and the exit code."""
    name, status = obj["metadata"]["name"], _status(obj)
    epoch = f" under region epoch {status.epoch}" if status.epoch is not None else ""
    lines = [f"{RESOURCE}/{name}: {status.phase.value}{epoch}: {status.message or '-'}"]
    if status.adopted:
        lines.append(f"Adopted ({len(status.adopted)}):")
        rows = [[r.namespace, r.name, str(r.epoch)] for r in status.adopted]
        lines += _table(["NAMESPACE", "NAME", "EPOCH"], rows)
    if status.not_adopted:
        lines.append(f"Not adopted ({len(status.not_adopted)}): they stay in their region")
        lines += _table(
            ["NAMESPACE", "NAME", "REASON"], [[r.namespace, r.name, r.reason] for r in status.not_adopted]
        )
    if status.unknown_outcomes:
        lines.append(
            f"Unknown outcomes ({len(status.unknown_outcomes)}): reconcile with the authoritative system"
        )
        rows = [
            [u.namespace, u.run, u.action, u.since.isoformat() if u.since else "-"]
            for u in status.unknown_outcomes
        ]
        lines += _table(["NAMESPACE", "RUN", "ACTION", "SINCE"], rows)
    if status.truncated:
        lines.append(f"... and {status.truncated} more entries, not listed (status.truncated)")
    if status.phase == FailoverPhase.REFUSED:
        return "\n".join(lines), 1
    return "\n".join(lines), LEFT_BEHIND if status.not_adopted else 0


def _region(value: str) -> str:
    try:
        return validate_region(value)
    except InvalidRegion as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun region ...`` (``argv`` without the leading ``region``)."""
    parser = argparse.ArgumentParser(prog="kubectl agentrun region", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    failover = commands.add_parser("failover", help="move a region's runs to another region")
    failover.add_argument("from_region", metavar="FROM", type=_region, help="the region whose runs move")
    failover.add_argument("--to", required=True, type=_region, help="the region that adopts them")
    failover.add_argument("--reason", help="why (recorded with the request)")
    failover.add_argument("--wait", action="store_true", help="wait until it is Completed or Refused")
    failover.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds --wait waits at most"
    )
    failover.add_argument("--kubeconfig")
    failover.add_argument("--context")
    args = parser.parse_args(argv)
    if args.from_region == args.to:
        print(
            f"error: a failover moves runs to another region: FROM and --to are both {args.to!r}",
            file=sys.stderr,
        )
        return 1
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        api = client.CustomObjectsApi()
        made = create(api, args.from_region, args.to, args.reason)
        name = made["metadata"]["name"]
        print(f"{RESOURCE}/{name} created", flush=True)
        if not args.wait:
            return 0
        done = wait_finished(api, name, args.timeout)
    except FailoverError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
    if not _finished(done):
        phase = (done.get("status") or {}).get("phase") or "not yet taken up by the operator serving it"
        print(f"error: {RESOURCE}/{name} not finished within {args.timeout:g}s ({phase})", file=sys.stderr)
        return 1
    text, code = report(done)
    print(text)
    return code
