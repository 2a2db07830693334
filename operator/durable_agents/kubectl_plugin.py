"""``kubectl agentrun``: approve, reject, inspect a run (installed as the ``kubectl-agentrun`` script).

    kubectl agentrun approve NAME [-n NS] [--reason TEXT]
    kubectl agentrun reject  NAME [-n NS] [--reason TEXT]
    kubectl agentrun cancel  NAME [-n NS] [--scope task|children|toolCall|turn] [--reason TEXT]
    kubectl agentrun retry   NAME [-n NS]     (a quarantined run, e.g. after an upgrade)
    kubectl agentrun status  NAME [-n NS] [--reveal]
    kubectl agentrun history NAME [-n NS]
    kubectl agentrun region failover FROM --to TO [--reason TEXT] [--wait] [--timeout SECONDS]

approve/reject read the pending approval request from the run's status and send the decision
(request ID + digest) as a patch on spec.approvals. Who you are is decided by the API server, and
what you may do by Kubernetes RBAC: the operator's admission webhook asks a SubjectAccessReview
for each kind of request, on the run (agentruns/NAME), and a refusal names the missing verb:

    approve, reject    the policy's verb (default "approve")
    cancel             "cancel"
    retry              "retry"
    answers, events    "answer"  (kubectl patch ... spec.answers / spec.events)

Creating a run needs verb "use" on the ServiceAccount it names (serviceaccounts/NAME, core group):
the run acts as it. Requests are stamped by the webhook; the operator acts on nothing else, and
a request once made cannot be changed or withdrawn.

``region failover`` asks for the runs of region FROM to move to region TO (a RegionFailover; the
webhook asks for verb "failover" on regions/FROM): :mod:`durable_agents.kubectl_region`.

Questions, effect arguments, answers, events and effect outcomes are stored sealed; ``status``
prints them as "(sealed)". ``status --reveal`` shows them to who may approve the run (the
policy's verb, default "approve"): it sends a server-side dry-run patch carrying a public key made
for this one request, and the operator's admission webhook answers, in the dry-run response, with
the values encrypted to that key. Nothing is stored; only this command can read the answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents import kubectl_region
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.disclosure import DisclosureError, new_reader_key, open_as_reader
from durable_agents.core.sealed_values import is_sealed
from durable_agents.shell.reveal import REVEAL_ANNOTATION, REVEALED_ANNOTATION


def _api(kubeconfig: str | None, context: str | None) -> tuple[client.CustomObjectsApi, str]:
    config.load_kube_config(config_file=kubeconfig, context=context)
    _, active = config.list_kube_config_contexts(config_file=kubeconfig)
    namespace = (active or {}).get("context", {}).get("namespace", "default")
    return client.CustomObjectsApi(), namespace


def _get(api: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)
    return out


def decide(api: client.CustomObjectsApi, ns: str, name: str, decision: str, reason: str | None) -> str:
    run = _get(api, ns, name)
    status = run.get("status") or {}
    request = status.get("approvalRequest")
    if not request:
        raise SystemExit(
            f"error: agentrun {ns}/{name} has no pending approval request (state {status.get('state')!r})"
        )
    body: dict[str, Any] = {"digest": request["digest"], "decision": decision}
    if reason:
        body["reason"] = reason
    patch = {"spec": {"approvals": {request["requestId"]: body}}}
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name, patch)
    except ApiException as err:
        message = err.body
        with contextlib.suppress(TypeError, ValueError):
            message = json.loads(err.body).get("message", err.body)
        raise SystemExit(f"error: the API server refused the decision: {message}") from None
    sent = f"{decision} sent for request {request['requestId']} ({request['effect']})"
    return f"agentrun.durable-agents.io/{name}: {sent}"


def _patch(api: client.CustomObjectsApi, ns: str, name: str, spec: dict[str, Any], what: str) -> None:
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name, {"spec": spec})
    except ApiException as err:
        message = err.body
        with contextlib.suppress(TypeError, ValueError):
            message = json.loads(err.body).get("message", err.body)
        raise SystemExit(f"error: the API server refused the {what}: {message}") from None


def cancel(api: client.CustomObjectsApi, ns: str, name: str, scope: str, reason: str | None) -> str:
    run = _get(api, ns, name)
    state = (run.get("status") or {}).get("state", "pending")
    if state in ("completed", "failed", "canceled", "expired"):
        raise SystemExit(f"error: agentrun {ns}/{name} has already ended ({state})")
    # Zero-padded: requests are handled in request-ID order.
    request_id = f"cancel-{len(run['spec'].get('cancellations') or {}) + 1:02d}"
    _patch(api, ns, name, {"cancellations": {request_id: {"scope": scope, "reason": reason or ""}}}, "cancel")
    return f"agentrun.durable-agents.io/{name}: {scope} cancellation {request_id} requested"


def retry(api: client.CustomObjectsApi, ns: str, name: str) -> str:
    run = _get(api, ns, name)
    status = run.get("status") or {}
    if status.get("state") != "quarantined":
        raise SystemExit(f"error: agentrun {ns}/{name} is not quarantined (state {status.get('state')!r})")
    token = f"retry-{status.get('stateVersion', 0)}"
    _patch(api, ns, name, {"retryQuarantine": token}, "retry")
    return f"agentrun.durable-agents.io/{name}: retry {token} requested"


def reveal(api: client.CustomObjectsApi, ns: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run, and its sealed values in plaintext (a dry run: nothing is stored)."""
    private, public = new_reader_key()
    body = {"metadata": {"annotations": {REVEAL_ANNOTATION: public}}}
    try:
        run: dict[str, Any] = api.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", name, body, dry_run="All"
        )
    except ApiException as err:
        message = err.body
        with contextlib.suppress(TypeError, ValueError):
            message = json.loads(err.body).get("message", err.body)
        raise SystemExit(f"error: the API server refused to reveal agentrun {ns}/{name}: {message}") from None
    answer = ((run.get("metadata") or {}).get("annotations") or {}).get(REVEALED_ANNOTATION)
    if not answer:
        raise SystemExit(
            f"error: no reveal answer for agentrun {ns}/{name}: is the operator's admission webhook enabled?"
        )
    try:
        return run, open_as_reader(private, answer, f"{ns}/{name}")
    except DisclosureError as err:
        raise SystemExit(f"error: the reveal answer for agentrun {ns}/{name} does not open: {err}") from None


def _shown(value: Any, revealed: Any = None, has_revealed: bool = False) -> str:
    """A value as printed: the revealed plaintext, "(sealed)", or a value stored in clear."""
    if has_revealed:
        value = revealed
    elif is_sealed(value):
        return "(sealed)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _revealed_lines(document: dict[str, Any]) -> list[str]:
    lines = ["Revealed (only to you; nothing was stored):"]
    for label, value in sorted((document.get("values") or {}).items()):
        lines.append(f"  {label}: {_shown(value)}")
    for action in document.get("actions") or []:
        lines.append(f"  action {action['name']} ({action.get('effect')}, {action.get('state')}):")
        lines.append(f"    arguments: {_shown(action.get('arguments'))}")
        lines.append(f"    outcome:   {_shown(action.get('outcome'))}")
    for label, why in sorted((document.get("unreadable") or {}).items()):
        lines.append(f"  not revealed: {label} ({why})")
    return lines


def describe(run: dict[str, Any], revealed: dict[str, Any] | None = None) -> str:
    status = run.get("status") or {}
    lines = [
        f"Name:        {run['metadata']['name']}",
        f"State:       {status.get('state', 'pending')} (stateVersion {status.get('stateVersion', 0)})",
        f"Waiting for: {status.get('waitingFor') or '-'}",
    ]
    pending = (status.get("checkpoint") or {}).get("pendingInput")
    if pending:
        shown = (revealed or {}).get("pendingInput") or {}
        question = _shown(pending.get("question"), shown.get("question"), "question" in shown)
        lines.append(f"Question:    {question} (answer as spec.answers[{pending.get('requestId')!r}])")
    request = status.get("approvalRequest")
    if request:
        shown = (revealed or {}).get("approvalRequest") or {}
        arguments = _shown(request.get("arguments"), shown.get("arguments"), "arguments" in shown)
        lines += [
            "Approval request:",
            f"  request ID:  {request['requestId']}",
            f"  action:      {request['effect']} ({request['tier']}) at step {request['step']}",
            f"  arguments:   {arguments}",
            f"  digest:      {request['digest']}",
            f"  reason:      {request['policyReason']}",
            f"  approver:    {request['approverRole']}",
            f"  runs as:     serviceaccount {request.get('serviceAccount', '-')}",
            f"  expires at:  {request['expiresAt']}",
            f"  decisions:   {', '.join(request['allowedDecisions'])}",
        ]
    if status.get("retryAt"):
        lines.append(f"Retry at:    {status['retryAt']}")
    cancellation = status.get("cancellation")
    if cancellation:
        reason = cancellation.get("reason", "")
        lines.append(f"Canceled:    {cancellation['requestId']} ({cancellation['scope']}) {reason}")
        for effect in cancellation.get("unreversedEffects", []):
            lines.append(
                f"  not undone: {effect['effect']} at step {effect['step']} ({effect['actionRecord']})"
            )
        for step in cancellation.get("proposedCompensations", []):
            lines.append(f"  proposed compensation: step {step}")
    for refused in status.get("refusedRequests", []):
        lines.append(f"Refused:     {refused['field']}[{refused['key']}] ({refused['reason']})")
    if status.get("outcome"):
        lines.append(
            f"Outcome:     {status['outcome'].get('reason')}: {status['outcome'].get('message', '')}"
        )
    if revealed is not None:
        lines += _revealed_lines(revealed)
    return "\n".join(lines)


def history(run: dict[str, Any]) -> str:
    rows = [f"{'VERSION':>7}  {'EVENT':<20} {'FROM':<18} {'TO':<18} {'AT':<28} DETAIL"]
    for h in (run.get("status") or {}).get("history", []):
        rows.append(
            f"{h['stateVersion']:>7}  {h['event']:<20} {h['from']:<18} {h['to']:<18} {h['at']:<28} "
            + h.get("detail", "")
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args_given = sys.argv[1:] if argv is None else argv
    if args_given[:1] == ["region"]:  # cluster-wide, no run named: its own parser
        return kubectl_region.main(args_given[1:])
    parser = argparse.ArgumentParser(prog="kubectl agentrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["approve", "reject", "cancel", "retry", "status", "history"])
    parser.add_argument("name")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--reason", help="why (recorded with the decision or cancellation)")
    parser.add_argument("--scope", default="task", choices=["task", "children", "toolCall", "turn"])
    parser.add_argument("--reveal", action="store_true", help="status: show sealed values (approvers)")
    args = parser.parse_args(args_given)
    api, default_ns = _api(args.kubeconfig, args.context)
    ns = args.namespace or default_ns
    try:
        if args.command in ("approve", "reject"):
            print(decide(api, ns, args.name, args.command, args.reason))
        elif args.command == "cancel":
            print(cancel(api, ns, args.name, args.scope, args.reason))
        elif args.command == "retry":
            print(retry(api, ns, args.name))
        elif args.command == "status" and args.reveal:
            print(describe(*reveal(api, ns, args.name)))
        elif args.command == "status":
            print(describe(_get(api, ns, args.name)))
        else:
            print(history(_get(api, ns, args.name)))
    except ApiException as err:
        print(f"error: {err.status} {err.reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
