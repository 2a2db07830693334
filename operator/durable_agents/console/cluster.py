"""The console's calls to the API server, each with the user's own client (blocking: the views run
them in a thread). The actions are the kubectl plugin's own functions; what they refuse, and
what the API server refuses, comes back as :class:`Refused` with the message a person reads."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.durations import InvalidDuration, parse_duration
from durable_agents.core.engine.children import label_value as run_label
from durable_agents.kubectl import answer as kubectl_answer
from durable_agents.kubectl import controls as kubectl_controls
from durable_agents.kubectl import decide as kubectl_decide
from durable_agents.kubectl import list as kubectl_list
from durable_agents.kubectl import main as kubectl_main
from durable_agents.kubectl import reconcile as kubectl_reconcile
from durable_agents.kubectl import why as kubectl_why
from durable_agents.kubectl.errors import api_message
from durable_agents.kubectl.reconcile import ReconcileError

ENDED: Final = frozenset({"completed", "failed", "canceled", "expired"})
CONTROL_VERBS: Final = ("cancel", "retry", "answer", "reconcile", "escalate")


class Refused(Exception):
    """The API server (or the plugin's check before it) said no; the message says why."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def refused(err: ApiException, what: str) -> Refused:
    if err.status == 401:
        return Refused("the API server did not accept your credentials (expired or wrong token)", 401)
    return Refused(f"the API server refused {what}: {api_message(err)}", err.status or 500)


def whoami(api: client.ApiClient) -> str:
    """The user the API server sees (a SelfSubjectReview); 401 raises. An API server that cannot
    say (before Kubernetes 1.28) leaves the page working, the user unnamed."""
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review({"metadata": {}})
    except ApiException as err:
        if err.status == 401:
            raise
        return "(unknown)"
    info = review.status.user_info if review.status else None
    return str(info.username) if info is not None and info.username else "(unknown)"


# -- the list -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListQuery:
    """The filters of ``kubectl agentrun list``, from a page's query string."""

    namespace: str | None  # None: all namespaces
    states: tuple[str, ...] = ()
    region: str | None = None
    waiting_longer_than: str = ""
    stuck: bool = False
    escalated: bool = False

    def args(self) -> argparse.Namespace:
        """The plugin's parsed arguments (kubectl_list.selected reads them); a bad one raises."""
        unknown = [s for s in self.states if s not in kubectl_list.STATES]
        if unknown:
            raise Refused(f"state {unknown[0]!r} is not one of {', '.join(kubectl_list.STATES)}", 400)
        try:
            longer = parse_duration(self.waiting_longer_than) if self.waiting_longer_than else None
        except InvalidDuration as err:
            raise Refused(f"waiting longer than: {err}", 400) from None
        return argparse.Namespace(
            state=list(self.states) or None,
            region=self.region or None,
            waiting_longer_than=longer,
            stuck=self.stuck,
            escalated=self.escalated,
        )


def list_runs(api: client.ApiClient, query: ListQuery) -> tuple[list[dict[str, Any]], str]:
    """The runs the filters keep (the plugin's order: longest in its state first), and the
    collection's resourceVersion (where the page's watch starts)."""
    args = query.args()
    custom = client.CustomObjectsApi(api)
    try:
        if query.namespace is None:
            listed = custom.list_cluster_custom_object(GROUP, VERSION, "agentruns")
        else:
            listed = custom.list_namespaced_custom_object(GROUP, VERSION, query.namespace, "agentruns")
    except ApiException as err:
        if err.status == 401:
            raise refused(err, "the list") from None
        raise Refused(
            kubectl_list.refusal(err, "list", "agentruns", query.namespace)[7:], err.status
        ) from None
    runs = kubectl_list.selected(list(listed.get("items") or []), args, datetime.now(UTC))
    return runs, str((listed.get("metadata") or {}).get("resourceVersion") or "")


# -- a run ----------------------------------------------------------------------------------------


def get_run(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    try:
        run: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", name
        )
    except ApiException as err:
        if err.status == 404:
            raise Refused(f"agentrun {name!r} not found in namespace {ns!r} (deleted?)", 404) from None
        if err.status == 401:
            raise refused(err, "the read") from None
        raise Refused(kubectl_list.refusal(err, "get", f"agentruns/{name}", ns)[7:], err.status) from None
    return run


def actions_of(api: client.ApiClient, ns: str, name: str) -> tuple[list[dict[str, Any]], str | None]:
    """The run's ActionRecords (the ledger) in step order, or why they cannot be read."""
    try:
        listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, ns, "actionrecords", label_selector=f"{RUN_LABEL}={run_label(name)}"
        )
    except ApiException as err:
        return [], api_message(err)
    mine = [
        a
        for a in listed.get("items") or []
        if ((a.get("spec") or {}).get("runRef") or {}).get("name") == name
    ]
    return sorted(
        mine, key=lambda a: ((a.get("spec") or {}).get("stepIndex", 0), a["metadata"]["name"])
    ), None


def why(run: dict[str, Any], actions: list[dict[str, Any]]) -> dict[str, Any]:
    """``kubectl agentrun why`` of the run (its unknown actions from the ledger already read)."""
    unknown = sorted(
        a["metadata"]["name"] for a in actions if (a.get("status") or {}).get("state") == "outcome_unknown"
    )
    return kubectl_why.explain(run, unknown)


def may(api: client.ApiClient, ns: str, name: str, verb: str, resource: str = "agentruns") -> bool:
    """A SelfSubjectAccessReview: may the user do ``verb`` on this run (the API server decides)?"""
    review = {
        "spec": {
            "resourceAttributes": {
                "namespace": ns,
                "verb": verb,
                "group": GROUP,
                "resource": resource,
                "name": name,
            }
        }
    }
    try:
        answer = client.AuthorizationV1Api(api).create_self_subject_access_review(review)
    except ApiException:
        return False
    return bool(answer.status and answer.status.allowed)


def approver_verb(run: Mapping[str, Any]) -> tuple[str, str]:
    """The verb (and resource) a decision on the run's request needs: the policy's, else approve."""
    request = (run.get("status") or {}).get("approvalRequest") or {}
    return str(request.get("approverVerb") or "approve"), str(request.get("approverResource") or "agentruns")


def possible(run: Mapping[str, Any], allowed: Callable[[str, str], bool]) -> set[str]:
    """The actions the page offers: those the run's state admits and RBAC gives the user
    (``allowed(verb, resource)``; every action is a patch of the run, checked with its verb)."""
    status = run.get("status") or {}
    state = str(status.get("state") or "pending")
    waiting = str(status.get("waitingFor") or "")
    offered: set[str] = set()
    if state not in ENDED:
        offered |= {"cancel", "escalate", "reconcile"}
    if state == "quarantined":
        offered.add("retry")
    if waiting.split(":", 1)[0] in ("input", "event"):
        offered.add("answer")
    if state == "waiting_approval" and status.get("approvalRequest"):
        offered.add("decide")
    if waiting.startswith("action:"):
        offered.add("settle")  # say whether an action whose outcome is unknown happened
    offered.add("reveal")  # a server-side dry-run patch, for who holds the approver verb
    if not allowed("patch", "agentruns"):
        return set()
    verb, resource = approver_verb(run)
    verbs = {v: (v, "agentruns") for v in CONTROL_VERBS} | {
        "decide": (verb, resource),
        "reveal": (verb, resource),
        "settle": (verb, resource),
    }
    kept = {action for action in offered if allowed(*verbs[action])}
    if "answer" in kept and (status.get("checkpoint") or {}).get("pendingInput"):
        kept.add("reveal")  # who may answer is shown the question it waits on (and nothing else)
    return kept


def reveal(api: client.ApiClient, ns: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``status --reveal``: the plugin's server-side dry-run reveal, with the user's client."""
    try:
        return kubectl_main.reveal(client.CustomObjectsApi(api), ns, name)
    except SystemExit as said:
        raise Refused(str(said.code).removeprefix("error: ")) from None


# -- the actions ----------------------------------------------------------------------------------


def act(api: client.ApiClient, ns: str, name: str, action: str, form: Mapping[str, str]) -> str:
    """Do ``action`` through the plugin's function for it; the line it prints, or :class:`Refused`."""
    custom = client.CustomObjectsApi(api)
    reason = form.get("reason", "").strip()
    try:
        if action == "cancel":
            return kubectl_main.cancel(custom, ns, name, "task", reason or None)
        if action == "retry":
            return kubectl_main.retry(custom, ns, name)
        if action == "answer":
            # Pinned to the question the page showed: refused if the run waits on another now.
            question = form.get("question") or None
            return kubectl_answer.answer(custom, ns, name, form.get("text", ""), question)
        if action == "escalate":
            return kubectl_controls.escalate(custom, ns, name, reason)
        if action == "reconcile":
            return kubectl_controls.ask_now(custom, ns, name, None)[0]
        if action == "settle":
            applied = form.get("applied")
            if applied not in ("true", "false"):
                raise Refused("say whether the action happened (applied true or false)", 400)
            record = form.get("record", "")
            return kubectl_reconcile.reconcile(custom, ns, name, record, applied == "true", reason or None)
        if action in ("approve", "reject"):
            return kubectl_decide.decide(
                custom, ns, name, action, form.get("request", ""), form.get("digest", ""), reason or None
            )
    except SystemExit as said:
        raise Refused(str(said.code).removeprefix("error: ")) from None
    except kubectl_decide.DecideError as err:  # superseded, or refused by the API server
        raise Refused(str(err), 403 if "refused" in str(err) else 409) from None
    except (kubectl_answer.AnswerError, ReconcileError) as err:
        raise Refused(str(err)) from None
    except ApiException as err:
        raise refused(err, f"the {action}") from None
    raise Refused(f"no such action: {action!r}", 404)
