"""``kubectl agentrun reconcile RUN --action NAME --applied|--not-applied``: say whether an action
whose outcome is unknown happened.

    kubectl agentrun reconcile RUN --action NAME (--applied | --not-applied) [--reason TEXT] [-n NS]

An action whose answer was lost (a timeout, a dropped connection) is ``outcome_unknown``; the
operator asks its authoritative system by idempotency key, but some systems cannot be asked (an
MCP tool has no standard query), and then only a person who can look can say. ``--applied``: it
happened; the action succeeds and is not sent again. ``--not-applied``: it did not; it is sent
again with the same idempotency key. NAME is the ActionRecord's name (``act-...``, listed by
``kubectl get actionrecords`` and in this command's error when it names none). Without
``--applied``/``--not-applied`` it asks the authoritative system now instead
(:mod:`durable_agents.kubectl.controls`, chosen by :mod:`durable_agents.kubectl.main`).

The answer is a merge patch on the run's ``spec.reconciliations`` (keyed by NAME, for the attempt
the record is at). The operator's admission webhook records who you are and when, and refuses it
unless a SubjectAccessReview gives you the run's policy approver verb (default ``approve`` on
``agentruns``); the operator acts only on an answer so stamped, once, for that attempt.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION, ActionState
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.engine.children import label_value as run_label
from durable_agents.core.reconciliations import FIELD, key_for
from durable_agents.kubectl.errors import api_message

RUN = f"agentrun.{GROUP}"
UNKNOWN = ActionState.OUTCOME_UNKNOWN.value


class ReconcileError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


def unknown_actions(api: client.CustomObjectsApi, ns: str, run: str) -> list[str]:
    """The names of the run's ActionRecords whose outcome is unknown."""
    listed = api.list_namespaced_custom_object(
        GROUP, VERSION, ns, "actionrecords", label_selector=f"{RUN_LABEL}={run_label(run)}"
    )
    return sorted(
        item["metadata"]["name"]
        for item in listed.get("items") or []
        if (item.get("spec") or {}).get("runRef", {}).get("name") == run
        and (item.get("status") or {}).get("state") == UNKNOWN
    )


def _record(api: client.CustomObjectsApi, ns: str, run: str, action: str) -> dict[str, Any]:
    try:
        record: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "actionrecords", action)
    except ApiException as err:
        if err.status != 404:
            raise
        waiting = unknown_actions(api, ns, run)
        listed = ", ".join(waiting) if waiting else "none"
        raise ReconcileError(
            f"there is no ActionRecord {action!r} in namespace {ns!r} (actions of {run} whose "
            f"outcome is unknown: {listed})"
        ) from None
    owner = ((record.get("spec") or {}).get("runRef") or {}).get("name")
    if owner != run:
        raise ReconcileError(f"ActionRecord {action!r} is an action of run {owner!r}, not of {run!r}")
    state = (record.get("status") or {}).get("state") or ActionState.INTENT.value
    if state != UNKNOWN:
        raise ReconcileError(
            f"ActionRecord {action!r} is {state!r}: only an action whose outcome is unknown is reconciled"
        )
    return record


def reconcile(
    api: client.CustomObjectsApi, ns: str, run: str, action: str, applied: bool, reason: str | None = None
) -> str:
    """Send the answer; a one-line confirmation. Raises :class:`ReconcileError` when it is refused."""
    body: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", run)
    record = _record(api, ns, run, action)
    attempt = int((record.get("status") or {}).get("attempts") or 0)
    key = key_for(action, attempt, (body.get("spec") or {}).get(FIELD) or {})
    entry = {"applied": applied, "attempt": attempt, "reason": reason or ""}
    try:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", run, {"spec": {FIELD: {key: entry}}}
        )
    except ApiException as err:
        raise ReconcileError(f"the API server refused the reconciliation: {api_message(err)}") from None
    answer = "applied (it will not be sent again)" if applied else "not applied (it will be sent again)"
    return f"{RUN}/{run}: action {action} attempt {attempt} reconciled as {answer}"


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun reconcile ...`` (``argv`` without the leading ``reconcile``)."""
    parser = argparse.ArgumentParser(prog="kubectl agentrun reconcile", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", metavar="RUN", help="the run the action belongs to")
    parser.add_argument("--action", required=True, metavar="NAME", help="the ActionRecord's name")
    answer = parser.add_mutually_exclusive_group(required=True)
    answer.add_argument("--applied", dest="applied", action="store_true", help="the effect happened")
    answer.add_argument("--not-applied", dest="applied", action="store_false", help="it did not happen")
    parser.add_argument("--reason", help="how you know (recorded with the answer)")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
        print(reconcile(client.CustomObjectsApi(), ns, args.run, args.action, args.applied, args.reason))
    except ReconcileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
    return 0
