"""``kubectl agentrun``: approve, reject, inspect a run (installed as the ``kubectl-agentrun`` script).

    kubectl agentrun inbox [-n NS | -A] [-o wide|json|yaml] [--watch]   (what waits for you)
    kubectl agentrun approve NAME [-n NS] --request ID --digest sha256:... [--reason TEXT]
    kubectl agentrun reject  NAME [-n NS] --request ID --digest sha256:... [--reason TEXT]
    kubectl agentrun cancel  NAME [-n NS] [--scope task|children|toolCall|turn] [--reason TEXT]
    kubectl agentrun retry   NAME [-n NS]     (a quarantined run, e.g. after an upgrade)
    kubectl agentrun answer  NAME TEXT [-n NS]   (the question or event it waits for now)
    kubectl agentrun status  NAME [-n NS] [--reveal]
    kubectl agentrun history NAME [-n NS]
    kubectl agentrun why     NAME [-n NS] [-o json|yaml]   (what it waits for, what would wake it)
    kubectl agentrun region failover FROM --to TO [--reason TEXT] [--wait] [--timeout SECONDS]
    kubectl agentrun reconcile NAME --action RECORD (--applied | --not-applied) [--reason TEXT]
    kubectl agentrun reconcile NAME [--action RECORD] [--wait 10s]   (ask the system now)
    kubectl agentrun escalate  NAME --reason TEXT
    kubectl agentrun list [-n NS | -A] [--state S] [--stuck] [--escalated] [-o wide|json|yaml]
    kubectl agentrun policy force-delete NAME --reason TEXT   (on call: a policy live runs use)
    kubectl agentrun policy diff -f FILE [-n NS] [-o json]   (what a policy version would do to live runs)
    kubectl agentrun console [-n NS] [--port P]   (the console on 127.0.0.1, acting as you: docs/console.md)

approve/reject name the request and digest the approver reviewed (``status`` and ``inbox`` print
the exact command); the plugin sends nothing when the pending request is another one
(:mod:`durable_agents.kubectl.decide`), else the decision as a patch on spec.approvals. Who you
are is decided by the API server, and what you may do by Kubernetes RBAC: the operator's admission
webhook asks a SubjectAccessReview for each kind of request, on the run (agentruns/NAME), and a
refusal names the missing verb:

    approve, reject    the policy's verb (default "approve")
    reconcile          the policy's verb: what happened to an action whose outcome stays unknown
                       (:mod:`durable_agents.kubectl.reconcile`)
    cancel             "cancel"
    retry              "retry"
    answer             "answer"  (spec.answers / spec.events, under the key waited for now:
                       :mod:`durable_agents.kubectl.answer`)

Creating a run needs verb "use" on the ServiceAccount it names (serviceaccounts/NAME, core group):
the run acts as it. Requests are stamped by the webhook; the operator acts on nothing else, and
a request once made cannot be changed or withdrawn.

``region failover`` asks for the runs of region FROM to move to region TO (a RegionFailover; the
webhook asks for verb "failover" on regions/FROM): :mod:`durable_agents.kubectl.region`.

Questions, effect arguments, answers, events and effect outcomes are stored sealed; ``status``
prints them as "(sealed)". So are, for a run of the model planner, what the model wrote (a call's
arguments, its stated reason) and what its tools returned: ``status`` shows the model's proposal
(tool, call, turn), the evidence the request rests on (IDs, content digests, the turn that read
it) and a table of the turns; revealed, the model's words are printed quoted and marked as
written by the model: they are the model's, never authority. ``status --reveal`` shows them to
who may approve the run (the policy's verb, default "approve"), and to who may answer it (verb
"answer") the question it waits on and nothing else (what was withheld is named): it sends a
server-side dry-run patch carrying a public key made for this one request, and the operator's
admission webhook answers, in the dry-run response, with the values encrypted to that key.
Nothing is stored; only this command can read the answer.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import REVEAL_ANNOTATION, REVEALED_ANNOTATION
from durable_agents.core.disclosure import DisclosureError, new_reader_key, open_as_reader
from durable_agents.core.inbox import answer_command, decide_command
from durable_agents.core.sealed_values import is_sealed
from durable_agents.kubectl import answer as kubectl_answer
from durable_agents.kubectl import controls as kubectl_controls
from durable_agents.kubectl import decide as kubectl_decide
from durable_agents.kubectl import inbox as kubectl_inbox
from durable_agents.kubectl import list as kubectl_list
from durable_agents.kubectl import policy as kubectl_policy
from durable_agents.kubectl import policy_force_delete as kubectl_policy_force_delete
from durable_agents.kubectl import progress as kubectl_progress
from durable_agents.kubectl import reconcile as kubectl_reconcile
from durable_agents.kubectl import region as kubectl_region
from durable_agents.kubectl import revealed as kubectl_revealed
from durable_agents.kubectl import why as kubectl_why


def _api(kubeconfig: str | None, context: str | None) -> tuple[client.CustomObjectsApi, str]:
    config.load_kube_config(config_file=kubeconfig, context=context)
    _, active = config.list_kube_config_contexts(config_file=kubeconfig)
    namespace = (active or {}).get("context", {}).get("namespace", "default")
    return client.CustomObjectsApi(), namespace


def _get(api: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, "agentruns", name)
    return out


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
    # Zero-padded: requests are handled in request-ID order. The next ID not taken: an entry
    # written by hand (the webhook off) is refused by the operator, but keeps its ID for good.
    taken = run["spec"].get("cancellations") or {}
    n = len(taken) + 1
    while f"cancel-{n:02d}" in taken:
        n += 1
    request_id = f"cancel-{n:02d}"
    _patch(api, ns, name, {"cancellations": {request_id: {"scope": scope, "reason": reason or ""}}}, "cancel")
    return f"agentrun.durable-agents.io/{name}: {scope} cancellation {request_id} requested"


def retry(api: client.CustomObjectsApi, ns: str, name: str) -> str:
    run = _get(api, ns, name)
    status = run.get("status") or {}
    if status.get("state") != "quarantined":
        raise SystemExit(f"error: agentrun {ns}/{name} is not quarantined (state {status.get('state')!r})")
    # One token per quarantine (a second retry of the same one is the same request), unless the
    # operator refused that token (set by hand, the webhook off): then the next one.
    base = f"retry-{status.get('stateVersion', 0)}"
    refused = {
        r.get("key") for r in status.get("refusedRequests") or [] if r.get("field") == "retryQuarantine"
    }
    tokens = itertools.chain([base], (f"{base}.{n}" for n in itertools.count(2)))
    token = next(t for t in tokens if t not in refused)
    _patch(api, ns, name, {"retryQuarantine": token}, "retry")
    return f"agentrun.durable-agents.io/{name}: retry {token} requested"


def reveal(api: client.CustomObjectsApi, ns: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run, and its sealed values in plaintext (a dry run: nothing is stored)."""
    private, public = new_reader_key(entropy=os.urandom)
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


MODEL_SAYS: Final = "model says (written by the model, not authority):"
_UNSAFE: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories escaped in the model's words: controls, format characters (bidirectional
overrides among them), separators, unassigned: nothing the model wrote moves the cursor, reorders
what is shown or ends its line, so its words cannot pass for the operator's."""


def _quoted(text: str) -> str:
    """``text`` as a quoted string whose every character is shown, none acted upon."""
    return "".join(
        (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        if unicodedata.category(c) in _UNSAFE
        else c
        for c in json.dumps(text, ensure_ascii=False)
    )


def _model_value(value: Any) -> str:
    """A value the model wrote or a tool returned, as printed (escaped, never raw text)."""
    return _quoted(value) if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _model_says(sealed: Any, revealed: Mapping[str, Any] | None) -> str:
    """The model's stated reason: quoted when revealed, "(sealed)" when not."""
    if sealed is None:
        return f"{MODEL_SAYS} (nothing)"
    if revealed is None or "reason" not in revealed:
        return f"{MODEL_SAYS} (sealed)" if is_sealed(sealed) else f"{MODEL_SAYS} {_model_value(sealed)}"
    words = revealed.get("reason")
    if not isinstance(words, Mapping) or not isinstance(words.get("text"), str):
        return f"{MODEL_SAYS} (not revealed)"
    return f"{MODEL_SAYS} {_quoted(words['text'])}"


def _proposal_lines(request: Mapping[str, Any], revealed: Mapping[str, Any] | None) -> list[str]:
    """The call the model proposed and what it said (``revealed``: the revealed request)."""
    proposal = request.get("proposal")
    if not isinstance(proposal, Mapping):
        return []
    call = f"{proposal.get('tool')} (call {proposal.get('callId')}, turn {proposal.get('turn')})"
    shown = revealed.get("proposal") if revealed is not None else None
    return [
        f"  proposal:    {call}, proposed by the model",
        f"  {_model_says(proposal.get('reason'), shown if isinstance(shown, Mapping) else None)}",
    ]


def _evidence_lines(request: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> list[str]:
    """The evidence the request rests on: what was read, at which version and content digest,
    and (a model's read) at which turn, whose result --reveal shows."""
    refs = {ref.get("id"): ref for ref in checkpoint.get("evidence") or [] if isinstance(ref, Mapping)}
    turns = (checkpoint.get("agent") or {}).get("turns") or []
    steps = {t.get("stepIndex"): t.get("index") for t in turns if isinstance(t, Mapping)}
    lines = []
    for ref_id in request.get("evidence") or []:
        ref = refs.get(ref_id) or {}
        if not ref:
            what = "(not in the checkpoint)"
        elif ref.get("source") == "external":
            what = str(ref.get("uri"))
        else:
            where = f"{ref['namespace']}/" if ref.get("namespace") else ""
            what = f"{ref.get('kind')} {where}{ref.get('name')}@{ref.get('resourceVersion')}"
        turn = steps.get(ref.get("stepIndex"))
        read = f", read at turn {turn}" if turn is not None else ""
        lines.append(f"  evidence:    {ref_id}: {what} {ref.get('contentDigest') or '-'}{read}")
    return lines


def _turns_lines(agent: Mapping[str, Any]) -> list[str]:
    """A table of the model's turns: the call, its step, how it ended, its tokens."""
    total = agent.get("usageTotal") or {}
    rows = [("TURN", "STEP", "TOOL", "CALL", "OUTCOME", "TOKENS IN/OUT")]
    for turn in agent.get("turns") or []:
        usage = turn.get("usage") or {}
        rows.append(
            (
                str(turn.get("index")),
                f"agent-{turn.get('stepIndex')}",
                str(turn.get("tool")),
                str(turn.get("callId")),
                str(turn.get("outcome")),
                f"{usage.get('inputTokens', 0)}/{usage.get('outputTokens', 0)}",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    title = (
        f"Model turns ({agent.get('model')}: {agent.get('modelCallsTotal', 0)} model calls, "
        f"tokens in/out {total.get('inputTokens', 0)}/{total.get('outputTokens', 0)}):"
    )
    return [title, *("  " + "  ".join([*map(str.ljust, row[:-1], widths), row[-1]]) for row in rows)]


def _revealed_turn_lines(turn: Mapping[str, Any]) -> list[str]:
    lines = [
        f"  turn {turn.get('index')} {turn.get('tool')} ({turn.get('outcome')}, call {turn.get('callId')}):"
    ]
    if "omitted" in turn:
        return [*lines, f"    not revealed: {turn['omitted']}"]
    lines.append(f"    arguments: {_model_value(turn.get('arguments'))}")
    lines.append(f"    {_model_says(turn.get('reason'), turn)}")
    if turn.get("outcome") != "pending":
        cut = " (truncated)" if turn.get("resultTruncated") else ""
        lines.append(f"    result{cut}: {_model_value(turn.get('result'))}")
    return lines


def _revealed_lines(document: dict[str, Any]) -> list[str]:
    lines = ["Revealed (only to you; nothing was stored):"]
    if kubectl_revealed.question_only(document):  # a responder's: the question, what was withheld
        lines += kubectl_revealed.question_lines(document)
    for label, value in sorted((document.get("values") or {}).items()):
        lines.append(f"  {label}: {_shown(value)}")
    for turn in document.get("turns") or []:
        lines += _revealed_turn_lines(turn)
    for action in document.get("actions") or []:
        lines.append(f"  action {action['name']} ({action.get('effect')}, {action.get('state')}):")
        lines.append(f"    arguments: {_shown(action.get('arguments'))}")
        lines.append(f"    outcome:   {_shown(action.get('outcome'))}")
    for label, why in sorted((document.get("unreadable") or {}).items()):
        lines.append(f"  not revealed: {label} ({why})")
    return lines


def _quorum_lines(request: Mapping[str, Any]) -> list[str]:
    """``approvals: 1 of 2 (alice); missing 1`` for a request that needs more than one."""
    quorum = int(request.get("quorum") or 1)
    if quorum <= 1:
        return []
    who = [str(vote.get("approver")) for vote in request.get("approvedBy") or []]
    named = f" ({', '.join(who)})" if who else ""
    return [f"  approvals:   {len(who)} of {quorum}{named}; missing {max(0, quorum - len(who))}"]


def _pinned_lines(run: Mapping[str, Any], request: Mapping[str, Any]) -> list[str]:
    """The exact commands that decide this request, pinned to its ID and digest."""
    meta = run.get("metadata") or {}
    name, ns = str(meta.get("name")), str(meta.get("namespace") or "default")
    return [
        f"  {decision + ':':<12} {decide_command(name, ns, request, decision)}"
        for decision in request.get("allowedDecisions") or []
    ]


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
        if shown.get("askedBy") == kubectl_revealed.ASKED_BY_MODEL and isinstance(shown.get("question"), str):
            question = f"asked by the model (its words, not authority): {_quoted(shown['question'])}"
        key = pending.get("key") or pending.get("requestId")  # a new key once an answer was refused
        lines.append(f"Question:    {question} (answer as spec.answers[{key!r}])")
        meta = run["metadata"]
        lines.append(f"  answer:      {answer_command(meta['name'], meta.get('namespace', ''), str(key))}")
    request = status.get("approvalRequest")
    if request:
        shown = (revealed or {}).get("approvalRequest") or {}
        arguments = _shown(request.get("arguments"), shown.get("arguments"), "arguments" in shown)
        lines += [
            "Approval request:",
            f"  request ID:  {request['requestId']}",
            f"  action:      {request['effect']} ({request['tier']}) at step {request['step']}",
            f"  arguments:   {arguments}",
            *_proposal_lines(request, shown if revealed is not None else None),
            *_evidence_lines(request, status.get("checkpoint") or {}),
            f"  digest:      {request['digest']}",
            f"  reason:      {request['policyReason']}",
            f"  approver:    {request['approverRole']}",
            f"  runs as:     serviceaccount {request.get('serviceAccount', '-')}",
            f"  expires at:  {request['expiresAt']}",
            f"  decisions:   {', '.join(request['allowedDecisions'])}",
            *_quorum_lines(request),
            *_pinned_lines(run, request),
        ]
    agent = (status.get("checkpoint") or {}).get("agent")
    if isinstance(agent, Mapping):
        lines += _turns_lines(agent)
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
    lines += kubectl_controls.controls_lines(status)  # escalate, reconcile RUN (ask now)
    if status.get("outcome"):
        lines.append(
            f"Outcome:     {status['outcome'].get('reason')}: {status['outcome'].get('message', '')}"
        )
        result = status["outcome"].get("result")
        if isinstance(result, str) and is_sealed(result):  # a model run's answer: its own words
            answer = (revealed or {}).get("answer")
            lines.append(f"  answer, {_model_says(result, answer and {'reason': answer})}")
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
    if args_given[:1] == ["reconcile"] and not {"--applied", "--not-applied"} & set(args_given):
        return kubectl_controls.main("reconcile", args_given[1:])  # no answer given: ask the system now
    if args_given[:1] == ["reconcile"]:  # an action's unknown outcome: its own options
        return kubectl_reconcile.main(args_given[1:])
    if args_given[:1] == ["why"]:  # what the run waits for, what would wake it: -o json|yaml
        return kubectl_why.main(args_given[1:])
    if args_given[:1] == ["answer"]:  # the question or event waited for now (durable_agents.kubectl.answer)
        return kubectl_answer.main(args_given[1:])
    if args_given[:1] in (["approve"], ["reject"]):  # pinned (durable_agents.kubectl.decide)
        return kubectl_decide.main(args_given[0], args_given[1:])
    if args_given[:1] == ["inbox"]:  # what waits for the caller (durable_agents.kubectl.inbox)
        return kubectl_inbox.main(args_given[1:])
    if args_given[:1] == ["list"]:  # the queue (durable_agents.kubectl.list)
        return kubectl_list.main(args_given[1:])
    if args_given[:2] == ["policy", "force-delete"]:  # (durable_agents.kubectl.policy_force_delete)
        return kubectl_policy_force_delete.main(args_given[2:])
    if args_given[:1] == ["policy"]:  # policy diff: what a version would do (durable_agents.kubectl.policy)
        return kubectl_policy.main(args_given[1:])
    if args_given[:1] == ["console"]:  # its own program (durable_agents.console): the plugin never imports it
        os.execv(sys.executable, [sys.executable, "-m", "durable_agents.console", *args_given[1:]])
    if args_given[:1] == ["escalate"]:  # mark for a person (durable_agents.kubectl.controls)
        return kubectl_controls.main("escalate", args_given[1:])
    parser = argparse.ArgumentParser(prog="kubectl agentrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["cancel", "retry", "status", "history"])
    parser.add_argument("name")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--reason", help="why (recorded with the cancellation)")
    parser.add_argument("--scope", default="task", choices=["task", "children", "toolCall", "turn"])
    parser.add_argument(
        "--reveal",
        action="store_true",
        help="status: show sealed values (approvers; the waiting question to who may answer)",
    )
    args = parser.parse_args(args_given)
    api, default_ns = _api(args.kubeconfig, args.context)
    ns = args.namespace or default_ns
    try:
        if args.command == "cancel":
            print(cancel(api, ns, args.name, args.scope, args.reason))
        elif args.command == "retry":
            print(retry(api, ns, args.name))
        elif args.command == "status" and args.reveal:
            run, revealed = reveal(api, ns, args.name)
            print("\n".join([describe(run, revealed), *kubectl_progress.in_flight_lines(api, ns, run)]))
        elif args.command == "status":
            run = _get(api, ns, args.name)
            print("\n".join([describe(run), *kubectl_progress.in_flight_lines(api, ns, run)]))
        else:
            print(history(_get(api, ns, args.name)))
    except ApiException as err:
        print(f"error: {err.status} {err.reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
