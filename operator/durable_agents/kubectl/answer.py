"""``kubectl agentrun answer RUN TEXT``: answer the question a run waits on, or deliver the event.

    kubectl agentrun answer RUN TEXT [-n NS] [--question NAME]

The key is the one the run waits under now (``status.waitingFor``: ``input:KEY`` is answered as
``spec.answers[KEY]``, ``event:KEY`` delivered as ``spec.events[KEY]``). It is the question's
request ID (or the event's name) unless an answer under it was refused (written without the
operator's admission webhook): then the run asks again under a new key (``KEY.2``, ...), and this
command answers that one. The webhook refuses the patch unless a SubjectAccessReview gives you
verb ``answer`` on the run, and seals the value; the operator acts only on a sealed one.

``--question NAME`` answers the question of that name (say ``mcp-0-1-stay``, an MCP server's
question: the answer is JSON, ``{"action": "accept", "content": {...}}``, checked by the webhook
against the server's requested schema) and refuses when the run does not wait on it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl.errors import api_message

RUN = f"agentrun.{GROUP}"
FIELDS = {"input": "answers", "event": "events"}


class AnswerError(Exception):
    """What went wrong, said for people (printed after "error: ")."""


def awaited(run: dict[str, Any]) -> tuple[str, str]:
    """(``answers`` or ``events``, the key) the run waits under now; :class:`AnswerError` if none."""
    status = run.get("status") or {}
    kind, _, key = (status.get("waitingFor") or "").partition(":")
    if kind not in FIELDS or not key:
        meta = run.get("metadata") or {}
        raise AnswerError(
            f"agentrun {meta.get('namespace')}/{meta.get('name')} waits for no answer or event "
            f"(state {status.get('state', 'pending')!r}, waiting for {status.get('waitingFor') or '-'})"
        )
    return FIELDS[kind], key


def answer(api: client.CustomObjectsApi, ns: str, name: str, text: str, question: str | None = None) -> str:
    """Send the answer (or event) under the key awaited now; a one-line confirmation.
    ``question``: the key the caller means to answer (refused unless it is the one awaited)."""
    run: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)
    field, key = awaited(run)
    if question is not None and (field, key) != ("answers", question):
        raise AnswerError(
            f"agentrun {ns}/{name} does not wait on question {question!r} now "
            f"(waiting for {(run.get('status') or {}).get('waitingFor') or '-'})"
        )
    if key in ((run.get("spec") or {}).get(field) or {}):
        raise AnswerError(
            f"spec.{field}[{key!r}] is given already; the operator has not decided on it yet (try again)"
        )
    try:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "agentruns", name, {"spec": {field: {key: text}}}
        )
    except ApiException as err:
        raise AnswerError(f"the API server refused the answer: {api_message(err)}") from None
    what = "answered" if field == "answers" else "event delivered"
    return f"{RUN}/{name}: {what} as spec.{field}[{key!r}]"


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun answer ...`` (``argv`` without the leading ``answer``)."""
    parser = argparse.ArgumentParser(prog="kubectl agentrun answer", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", metavar="RUN")
    parser.add_argument("text", metavar="TEXT", help="the answer (or the event's payload)")
    parser.add_argument("--question", metavar="NAME", help="the question answered (refused if not awaited)")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
        print(answer(client.CustomObjectsApi(), ns, args.run, args.text, args.question))
    except AnswerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
    return 0
