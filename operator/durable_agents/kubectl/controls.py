"""``kubectl agentrun escalate`` and ``kubectl agentrun reconcile RUN`` (ask now): the on-call
controls that are single requests on the run's spec.

    kubectl agentrun escalate  RUN --reason TEXT [-n NS]
    kubectl agentrun reconcile RUN [--action NAME] [--wait 10s] [-n NS]

``escalate`` marks the run for a person: ``spec.escalation`` (a new token, the reason); the
operator sets condition ``Escalated`` (who and why) and posts a Warning Event. ``reconcile RUN``
without ``--applied``/``--not-applied`` asks the authoritative system NOW about the run's actions
whose outcome is unknown (or the one named), instead of waiting for the next paced query:
``spec.reconcileNow``; with ``--wait`` it prints the answers (``status.reconcileNow``) when they
come. The operator's admission webhook stamps who asked, after a SubjectAccessReview for verb
``escalate`` or ``reconcile`` on the run; a refusal names the missing verb. The operator acts only
on a stamped request (:mod:`durable_agents.shell.runs.controls`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.kubectl.errors import api_message
from durable_agents.kubectl.list import refusal
from durable_agents.kubectl.reconcile import ReconcileError, _record, unknown_actions

RUN = f"agentrun.{GROUP}"


def token(kind: str) -> str:
    """A new request's token (a new token is a new request)."""
    return f"{kind}-{time.time_ns() // 1000:x}"


def _send(
    api: client.CustomObjectsApi, ns: str, name: str, field: str, value: dict[str, Any], verb: str
) -> None:
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name, {"spec": {field: value}})
    except ApiException as err:
        if err.status == 403 and "admission webhook" not in api_message(err):
            also = f", and verb {verb!r} (checked by the operator's admission webhook)"
            raise ReconcileError(
                refusal(err, "patch", f"agentruns/{name}", ns, also)[len("error: ") :]
            ) from None
        raise ReconcileError(f"the API server refused the request: {api_message(err)}") from None


def escalate(api: client.CustomObjectsApi, ns: str, name: str, reason: str) -> str:
    if not reason.strip():
        raise ReconcileError("--reason must say why a person is needed")
    asked = token("escalate")
    _send(api, ns, name, "escalation", {"token": asked, "reason": reason}, "escalate")
    return f"{RUN}/{name}: escalation {asked} requested ({reason})"


def ask_now(api: client.CustomObjectsApi, ns: str, name: str, action: str | None) -> tuple[str, str]:
    """Send the request; a line saying what was asked, and its token."""
    api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)  # a 404 says which run
    if action is not None:
        _record(api, ns, name, action)  # this run's, and its outcome unknown: else why not
        about = [action]
    else:
        about = unknown_actions(api, ns, name)
    asked = token("ask")
    _send(api, ns, name, "reconcileNow", {"token": asked, "action": action}, "reconcile")
    what = ", ".join(about) if about else "no action's outcome is unknown now"
    return f"{RUN}/{name}: asked the authoritative system now (request {asked}) about: {what}", asked


def answers(api: client.CustomObjectsApi, ns: str, name: str, asked: str, wait: float) -> list[str] | None:
    """The answers to request ``asked`` once the operator wrote them (None: not within ``wait``)."""
    deadline = time.monotonic() + wait
    while True:
        status = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name).get("status") or {}
        for refused in status.get("refusedRequests") or []:
            if (refused.get("field"), refused.get("key")) == ("reconcileNow", asked):
                raise ReconcileError(f"the operator refused request {asked}: {refused.get('message')}")
        done = status.get("reconcileNow") or {}
        if done.get("token") == asked:
            said = [
                f"  {a.get('action')}: {a.get('answer')}" + (f" ({a['message']})" if a.get("message") else "")
                for a in done.get("answers") or []
            ]
            return said or ["  no action's outcome was unknown: nothing to ask"]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def controls_lines(status: dict[str, Any]) -> list[str]:
    """``kubectl agentrun status``: the escalation and the last "ask now" with its answers."""
    lines = []
    escalation = status.get("escalation")
    if escalation:
        by, at = escalation.get("escalatedBy"), escalation.get("escalatedAt")
        lines.append(f"Escalated:   by {by} at {at}: {escalation.get('reason')}")
    asked = status.get("reconcileNow")
    if asked:
        lines.append(f"Asked now:   {asked.get('token')} by {asked.get('askedBy')} at {asked.get('askedAt')}")
        for answer in asked.get("answers") or []:
            said = f" ({answer['message']})" if answer.get("message") else ""
            lines.append(f"  {answer.get('action')}: {answer.get('answer')}{said}")
    return lines


def main(command: str, argv: list[str]) -> int:
    """``kubectl agentrun escalate ...`` or ``kubectl agentrun reconcile RUN [--action] [--wait]``."""
    parser = argparse.ArgumentParser(prog=f"kubectl agentrun {command}", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", metavar="RUN")
    if command == "escalate":
        parser.add_argument("--reason", required=True, help="why a person is needed (shown in the condition)")
    else:
        parser.add_argument("--action", metavar="NAME", help="ask about this ActionRecord only")
        parser.add_argument("--wait", default="0s", metavar="DURATION", help="wait this long for the answer")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    config.load_kube_config(config_file=args.kubeconfig, context=args.context)
    _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
    ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
    api = client.CustomObjectsApi()
    try:
        if command == "escalate":
            print(escalate(api, ns, args.run, args.reason))
            return 0
        wait = parse_duration(args.wait).total_seconds()
        line, asked = ask_now(api, ns, args.run, args.action)
        print(line)
        if wait > 0:
            said = answers(api, ns, args.run, asked, wait)
            if said is None:
                print(
                    f"error: no answer within {args.wait} (see kubectl agentrun status {args.run})",
                    file=sys.stderr,
                )
                return 1
            print("\n".join(["Answers:", *said]))
    except InvalidDuration as err:
        print(f"error: --wait: {err}", file=sys.stderr)
        return 1
    except ReconcileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        verb = "get" if err.status == 403 else ""
        print(
            refusal(err, verb, "agentruns", ns)
            if verb
            else f"error: {err.status} {err.reason}: {api_message(err)}",
            file=sys.stderr,
        )
        return 1
    return 0
