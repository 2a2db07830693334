"""``kubectl agentrun inbox``: what waits for you to decide or answer, now.

    kubectl agentrun inbox [-n NS | -A] [-o wide|json|yaml] [--watch [--timeout 10m]]

The approval requests you may decide (the same SelfSubjectAccessReview the operator's admission
webhook asks: the request's verb on its resource, for the run's name), without the runs you
created when their policy asks for four eyes, without those you decided already (a quorum) and
those expired; and the questions you may answer (verb ``answer``). Oldest first, each with the
exact command that decides or answers it (pinned to the request ID and digest:
:mod:`durable_agents.kubectl.decide`). Who you are comes from a SelfSubjectReview (``kubectl auth
whoami``). One list of runs per namespace (``-A``: one cluster-wide list, else one per namespace
you may list), one access review per (namespace, verb, resource, run) and listing.

``--watch`` prints the inbox again whenever it changes (on watch events of the runs; every few
seconds when no single watch covers the namespaces), until ``--timeout`` or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.core.inbox import InboxEntry, entries
from durable_agents.kubectl.errors import api_message
from durable_agents.kubectl.list import human_duration, refusal

POLL_SECONDS = 5.0
WATCH_SECONDS = 60
"""Each watch stream ends after this long and is opened again (a bounded request)."""


class InboxError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


@dataclass
class Access:
    """SelfSubjectAccessReviews, each asked once per listing (a Role may name runs:
    ``resourceNames``, so the answer is asked for the run's name)."""

    api: client.AuthorizationV1Api
    answers: dict[tuple[str, str, str, str], bool] = field(default_factory=dict)

    def may(self, namespace: str, verb: str, resource: str, name: str) -> bool:
        key = (namespace, verb, resource, name)
        if key not in self.answers:
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        group=GROUP, resource=resource, verb=verb, namespace=namespace, name=name
                    )
                )
            )
            answer = self.api.create_self_subject_access_review(review)
            self.answers[key] = bool(answer.status and answer.status.allowed)
        return self.answers[key]


def whoami(api: client.ApiClient) -> str | None:
    """The caller's username as the API server authenticates it (None: it would not say)."""
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
    except ApiException:
        return None
    info = review.status.user_info if review.status is not None else None
    return str(info.username) if info is not None and info.username else None


@dataclass
class Listed:
    """The runs read, and the namespaces whose runs the caller may not list (``-A`` only)."""

    runs: list[dict[str, Any]]
    forbidden: list[str] = field(default_factory=list)
    cluster_wide: bool = False
    resource_version: str | None = None
    """The list's (a watch goes on from it: no event for what was listed)."""


def _listed(answer: dict[str, Any], cluster_wide: bool = False) -> Listed:
    version = (answer.get("metadata") or {}).get("resourceVersion")
    return Listed(list(answer.get("items") or []), cluster_wide=cluster_wide, resource_version=version)


def list_runs(api: client.ApiClient, namespace: str | None) -> Listed:
    """One list of runs in ``namespace``; with None, one cluster-wide list or one per namespace."""
    custom = client.CustomObjectsApi(api)
    if namespace is not None:
        try:
            return _listed(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns"))
        except ApiException as err:
            raise InboxError(refusal(err, "list", "agentruns", namespace)[len("error: ") :]) from None
    try:
        return _listed(custom.list_cluster_custom_object(GROUP, VERSION, "agentruns"), cluster_wide=True)
    except ApiException as err:
        if err.status != 403:
            raise
    try:
        names = [ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items]
    except ApiException as err:
        raise InboxError(
            "you may list agentruns in no namespace cluster-wide and may not list namespaces "
            f"(the API server said: {api_message(err)}): name one with -n NS"
        ) from None
    listed = Listed([])
    for name in sorted(names):
        try:
            listed.runs += custom.list_namespaced_custom_object(GROUP, VERSION, name, "agentruns")["items"]
        except ApiException as err:
            if err.status != 403:
                raise
            listed.forbidden.append(name)
    return listed


def _item(entry: InboxEntry) -> dict[str, Any]:
    return {
        "namespace": entry.namespace,
        "run": entry.run,
        "kind": entry.kind,
        "request": entry.request,
        "action": entry.action,
        "tier": entry.tier,
        "target": entry.target,
        "digest": entry.digest,
        "policyVersion": entry.policy_version,
        "approvals": entry.approvals,
        "waitingSince": entry.waiting_since.isoformat() if entry.waiting_since else None,
        "expiresAt": entry.expires_at.isoformat() if entry.expires_at else None,
        "command": entry.command,
        "commands": [entry.command, *entry.extra_commands],
    }


def document(found: list[InboxEntry], me: str | None) -> dict[str, Any]:
    """The inbox as ``-o json|yaml`` prints it."""
    return {"kind": "AgentRunInbox", "user": me, "items": [_item(entry) for entry in found]}


def table(found: list[InboxEntry], now: datetime, wide: bool) -> str:
    header = ["NAMESPACE", "RUN", "KIND", "REQUEST", "ACTION", "AGE", "EXPIRES", "APPROVALS"]
    rows = [header + (["TIER", "TARGET", "DIGEST", "COMMAND"] if wide else [])]
    for e in found:
        row = [
            e.namespace,
            e.run,
            e.kind,
            e.request,
            e.action if e.tier is None else f"{e.action} ({e.tier})",
            human_duration(now - (e.waiting_since or now)),
            f"in {human_duration(e.expires_at - now)}" if e.expires_at else "-",
            e.approvals or "-",
        ]
        rows.append(row + ([e.tier or "-", e.target or "-", e.digest or "-", e.command] if wide else []))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["   ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]) for row in rows]
    if not wide:  # the exact commands: what a person copies
        lines += ["", *(f"{e.namespace}/{e.run} {e.request}: {e.command}" for e in found)]
    return "\n".join(lines)


def render(found: list[InboxEntry], me: str | None, output: str | None, now: datetime) -> str:
    if output == "json":
        return json.dumps(document(found, me), indent=4)
    if output == "yaml":
        return yaml.safe_dump(document(found, me), sort_keys=False).rstrip("\n")
    return table(found, now, output == "wide") if found else ""


def inbox(api: client.ApiClient, namespace: str | None, me: str | None) -> tuple[list[InboxEntry], Listed]:
    """What waits for ``me`` (one listing; its access reviews asked once each)."""
    listed = list_runs(api, namespace)
    access = Access(client.AuthorizationV1Api(api))
    return entries(listed.runs, me, access.may, datetime.now(UTC)), listed


def _notes(listed: Listed, namespace: str | None, found: list[InboxEntry]) -> list[str]:
    notes = []
    if listed.forbidden:
        shown = ", ".join(listed.forbidden[:10]) + (", ..." if len(listed.forbidden) > 10 else "")
        notes.append(f"you may not list agentruns in {len(listed.forbidden)} namespace(s): {shown}")
    if not found:
        where = f"in {namespace}" if namespace else "in any namespace you may list"
        notes.append(f"nothing waits for you {where}")
    return notes


def _events(api: client.ApiClient, namespace: str | None, listed: Listed, until: float) -> Iterator[None]:
    """Yields whenever the runs may have changed: on watch events (from the list's version on),
    else every few seconds (no single watch covers the namespaces, or verb watch is not held)."""
    custom = client.CustomObjectsApi(api)
    version, polling = listed.resource_version, namespace is None and not listed.cluster_wide
    while time.monotonic() < until:
        bound = max(1, int(min(WATCH_SECONDS, until - time.monotonic())))  # until: inf without --timeout
        if polling:
            time.sleep(min(POLL_SECONDS, bound))
            yield None
            continue
        where = () if namespace is None else (namespace,)
        func = (
            custom.list_cluster_custom_object if namespace is None else custom.list_namespaced_custom_object
        )
        stream = watch.Watch()
        try:
            for _ in stream.stream(
                func, GROUP, VERSION, *where, "agentruns", resource_version=version, timeout_seconds=bound
            ):
                version = stream.resource_version
                yield None
                if time.monotonic() >= until:
                    return
        except ApiException as err:
            if err.status == 403:
                polling = True
                print(
                    f"you may not watch agentruns: listing again every {POLL_SECONDS:.0f}s", file=sys.stderr
                )
            elif err.status == 410:
                version = None  # too old: the next stream starts from now (its first events re-list)
            else:
                raise
            yield None


def run(api: client.ApiClient, args: argparse.Namespace, namespace: str | None) -> int:
    me = whoami(api)
    if me is None:
        print("warning: the API server did not say who you are: four-eyes is not applied", file=sys.stderr)
    found, listed = inbox(api, namespace, me)
    shown = render(found, me, args.output, datetime.now(UTC))
    if shown:
        print(shown, flush=True)
    for note in _notes(listed, namespace, found):
        print(note, file=sys.stderr, flush=True)
    if not args.watch:
        return 0
    until = time.monotonic() + (args.timeout.total_seconds() if args.timeout else float("inf"))
    last = [(e.namespace, e.run, e.request, e.approvals) for e in found]
    for _ in _events(api, namespace, listed, until):
        found, listed = inbox(api, namespace, me)
        now_seen = [(e.namespace, e.run, e.request, e.approvals) for e in found]
        if now_seen != last:
            last = now_seen
            print(
                render(found, me, args.output, datetime.now(UTC))
                or "\n".join(_notes(listed, namespace, found)),
                flush=True,
            )
    return 0


def _duration(text: str) -> Any:
    try:
        return parse_duration(text)
    except InvalidDuration as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun inbox ...`` (``argv`` without the leading ``inbox``)."""
    parser = argparse.ArgumentParser(prog="kubectl agentrun inbox", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--namespace")
    parser.add_argument("-A", "--all-namespaces", action="store_true")
    parser.add_argument("-o", "--output", choices=["wide", "json", "yaml"])
    parser.add_argument("-w", "--watch", action="store_true", help="print the inbox again when it changes")
    parser.add_argument(
        "--timeout", type=_duration, metavar="DURATION", help="--watch: stop after (e.g. 10m)"
    )
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    config.load_kube_config(config_file=args.kubeconfig, context=args.context)
    _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
    namespace = (
        None
        if args.all_namespaces
        else args.namespace or (active or {}).get("context", {}).get("namespace", "default")
    )
    try:
        return run(client.ApiClient(), args, namespace)
    except KeyboardInterrupt:
        return 0
    except InboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
