"""``kubectl agentrun approve|reject``: a decision pinned to the request and digest reviewed.

    kubectl agentrun approve RUN -n NS --request ID --digest sha256:... [--reason TEXT]
    kubectl agentrun reject  RUN -n NS --request ID --digest sha256:... [--reason TEXT]

Both flags are required: they name what the approver reviewed (``kubectl agentrun status`` and
``kubectl agentrun inbox`` print the exact command). The plugin reads the run and sends nothing
when the pending request is another one (a re-approval after a policy or evidence change, a model
that proposed again) or there is none: it says what changed. Without the flags it prints the
pinned command for the current request and sends nothing. The admission webhook and the operator
check the digest again (a request superseded between this read and the write is refused there).

The decision goes under ``spec.approvals[next key]`` (the request ID, or ``<request>.<k>`` under
a quorum, :func:`durable_agents.core.approvals.next_decision_key`); when another approver took
that key meanwhile, the plugin reads again and uses the next one (bounded).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.approvals import next_decision_key
from durable_agents.core.inbox import decide_command, superseded
from durable_agents.kubectl.errors import api_message

RUN = f"agentrun.{GROUP}"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
KEY_ATTEMPTS = 4
"""Writes tried when concurrent approvers take the key first (each a new read)."""


class DecideError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


def _get(api: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)
    return out


def unpinned(run: dict[str, Any], decision: str) -> str:
    """The message for a decision given without --request/--digest: what to review, the command."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    request = status.get("approvalRequest")
    if not request:
        return (
            f"agentrun {ns}/{name} has no pending approval request (state {status.get('state')!r}); "
            "nothing was sent"
        )
    return (
        f"a decision names the request and digest you reviewed (--request and --digest); nothing was "
        f"sent. The pending request is {request.get('requestId')} ({request.get('effect')}, "
        f"{request.get('tier')}, digest {request.get('digest')}). Review it "
        f"(kubectl agentrun status {name} -n {ns} --reveal), then:\n"
        f"  {decide_command(name, ns, request, decision)}"
    )


def send(
    api: client.CustomObjectsApi,
    ns: str,
    name: str,
    key: str,
    digest: str,
    decision: str,
    reason: str | None,
) -> None:
    """Write the decision under ``key`` (the admission webhook stamps and checks it)."""
    body: dict[str, Any] = {"digest": digest, "decision": decision}
    if reason:
        body["reason"] = reason
    api.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "agentruns", name, {"spec": {"approvals": {key: body}}}
    )


def decide(
    api: client.CustomObjectsApi,
    ns: str,
    name: str,
    decision: str,
    request_id: str,
    digest: str,
    reason: str | None = None,
) -> str:
    """Send ``decision`` on (``request_id``, ``digest``) if that is still the pending request."""
    if not DIGEST.match(digest):
        raise DecideError(
            f"--digest {digest!r} is not a request digest: 'sha256:' and 64 lower-case hex digits "
            "(copy it from kubectl agentrun status or inbox)"
        )
    for _ in range(KEY_ATTEMPTS):
        run = _get(api, ns, name)
        request = (run.get("status") or {}).get("approvalRequest")
        problem = superseded(name, ns, request, request_id, digest)
        if problem is not None:
            raise DecideError(problem)
        approvals = (run.get("spec") or {}).get("approvals") or {}
        key = next_decision_key(approvals, request_id)
        try:
            send(api, ns, name, key, digest, decision, reason)
        except ApiException as err:
            if err.status in (403, 409, 422) and key in (
                (_get(api, ns, name).get("spec") or {}).get("approvals") or {}
            ):
                continue  # another approver took this key meanwhile: read again, the next key
            raise DecideError(f"the API server refused the decision: {api_message(err)}") from None
        where = f" as spec.approvals[{key!r}]" if key != request_id else ""
        return (
            f"{RUN}/{name}: {decision} sent for request {request_id} ({(request or {}).get('effect')}){where}"
        )
    raise DecideError(f"other approvers kept taking the next decision key of request {request_id}: try again")


def main(decision: str, argv: list[str]) -> int:
    """``kubectl agentrun approve|reject RUN --request ID --digest D [--reason TEXT]``."""
    parser = argparse.ArgumentParser(
        prog=f"kubectl agentrun {decision}", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run", metavar="RUN")
    parser.add_argument("--request", metavar="ID", help="the request ID you reviewed")
    parser.add_argument("--digest", metavar="sha256:...", help="the digest of the request you reviewed")
    parser.add_argument("--reason", help="why (recorded with the decision)")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    config.load_kube_config(config_file=args.kubeconfig, context=args.context)
    _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
    ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
    api = client.CustomObjectsApi()
    try:
        if not args.request or not args.digest:
            print(f"error: {unpinned(_get(api, ns, args.run), decision)}", file=sys.stderr)
            return 1
        print(decide(api, ns, args.run, decision, args.request, args.digest, args.reason))
    except DecideError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
    return 0
