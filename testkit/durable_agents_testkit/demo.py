"""``make demo``: the main job, start to finish, on the embedded local control plane.

Starts the local control plane (or uses the cluster named by KUBECONFIG), installs the CRDs,
starts the operator as its own user with the chart's RBAC rules, applies a run that reads a
ConfigMap, asks a question and waits for an event; answers both with ``kubectl patch`` (printing
each command), and prints the completed run and its transition timeline.

Act 2, the model planner: starts the reference model server (with an API key) and the reference
system on loopback, applies config/samples/agentrun-model.yaml pointed at them; the model reads
the refund limits and proposes a refund, which waits for an approval bound to a digest. The demo
prints the proposal and the facts the request binds, approves it with ``kubectl patch`` as a
person allowed to, and prints the refund applied once, the agent's facts and the timeline. Stops
everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane, find_repo_root
from durable_agents_testkit.modelserver import ModelServerThread
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import grant_operator, manage
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs

OPERATOR_USER = "durable-agents-operator"
MODEL_SAMPLE = "config/samples/agentrun-model.yaml"
MODEL_SCRIPT = "config/samples/reference-model/refunds-script.yaml"
APPROVER = "demo-approver"
LONG = 200  # a revealed object read as evidence, say: the demo shows its start


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n==> {text}")


@contextlib.contextmanager
def cluster() -> Iterator[tuple[KubeEnv, list[str]]]:
    """The demo's cluster and the kubectl command line to reach it."""
    external = os.environ.get("KUBECONFIG")
    if external:
        step(f"using the cluster of KUBECONFIG={external}")
        bin_dir = os.environ.get("DURABLE_AGENTS_BIN_DIR")
        kubectl = str(Path(bin_dir) / "kubectl") if bin_dir else shutil.which("kubectl") or "kubectl"
        yield KubeEnv.external(Path(external)), [kubectl, "--kubeconfig", external]
        return
    step("starting the embedded local control plane (etcd + kube-apiserver, built from Go modules)")
    with LocalControlPlane() as plane:
        env = KubeEnv.local(plane)
        say(f"    API server {plane.server_url}, ready in {plane.startup_seconds or 0:.1f}s")
        yield env, [str(plane.bin_dir / "kubectl"), "--kubeconfig", str(plane.kubeconfig_path)]


def kubectl(base: list[str], *args: str, show: bool = True, who: str = "") -> str:
    cmd = [*base, *args]
    if show:
        shown = ["kubectl", *args]
        say("    $ " + " ".join(shlex.quote(a) for a in shown) + (f"      # as user {who}" if who else ""))
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kubectl failed: {out.stderr.strip()}")
    return out.stdout


def patch_spec(base: list[str], ns: str, name: str, patch: str) -> None:
    kubectl(base, "-n", ns, "patch", "agentrun", name, "--type=merge", "-p", patch)


def operator_kubeconfig(env: KubeEnv, repo: Path) -> Path:
    grant_operator(env.api, OPERATOR_USER)  # the chart's cluster-wide rules; the demo's namespace is managed
    if env.plane is None:
        return env.kubeconfig
    return Path(env.plane.write_user_kubeconfig(OPERATOR_USER, []))


def prepare_namespace(env: KubeEnv, ns: str) -> None:
    core = client.CoreV1Api(env.api)
    rbac = client.RbacAuthorizationV1Api(env.api)
    core.create_namespace({"metadata": {"name": ns}})
    manage(env.api, ns, OPERATOR_USER)  # the operator may act as its ServiceAccounts, keeps Leases there
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "rollout-settings"}, "data": {"maxSurge": "25%", "maxUnavailable": "0"}}
    )
    # The run acts as its ServiceAccount: it may read the settings and write one ConfigMap.
    configmaps: dict[str, Any] = {"apiGroups": [""], "resources": ["configmaps"]}
    rules = [
        {**configmaps, "verbs": ["get"], "resourceNames": ["rollout-settings", "rollout-strategy"]},
        {**configmaps, "verbs": ["patch"], "resourceNames": ["rollout-strategy"]},
        {**configmaps, "verbs": ["create"]},
    ]
    rbac.create_namespaced_role(ns, {"metadata": {"name": "rollout-agent"}, "rules": rules})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "rollout-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rollout-agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "rollout-agent", "namespace": ns}],
        },
    )


def approver_kubeconfig(env: KubeEnv, ns: str) -> Path:
    """A person allowed by RBAC to approve runs here (verb approve on agentruns): user demo-approver."""
    assert env.plane is not None
    rbac = client.RbacAuthorizationV1Api(env.api)
    with contextlib.suppress(client.ApiException):  # already there: the second act asks again
        rbac.create_namespaced_role(
            ns,
            {
                "metadata": {"name": "agentrun-approver"},
                "rules": [
                    {
                        "apiGroups": ["durable-agents.io"],
                        "resources": ["agentruns"],
                        "verbs": ["get", "list", "patch", "approve"],
                    }
                ],
            },
        )
    with contextlib.suppress(client.ApiException):
        rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": "agentrun-approvers"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "agentrun-approver",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "agentrun-approvers"}
                ],
            },
        )
    return env.plane.write_user_kubeconfig(APPROVER, ["agentrun-approvers"])


def approve(env: KubeEnv, runs: Runs, ns: str, name: str) -> None:
    """The change is consequential (policy): a person allowed by RBAC approves it."""
    parked = runs.wait_state(name, "waiting_approval", timeout=60)
    request = parked["status"]["approvalRequest"]
    step("the configuration change needs an approval: the request, bound to a digest")
    approver = approver_kubeconfig(env, ns)
    pinned = ["--request", request["requestId"], "--digest", request["digest"]]  # what was reviewed
    for args in (
        ["inbox", "-n", ns],  # what waits for this approver, with the command to decide it
        ["status", name, "-n", ns],
        ["approve", name, "-n", ns, *pinned, "--reason", "window is open"],
    ):
        kubectl_agentrun(approver, *args)
    stamped(runs, name, request["requestId"])


def kubectl_agentrun(kubeconfig: Path, *args: str, grep: str | None = None) -> None:
    """The kubectl plugin (kubectl agentrun ...) as the user of ``kubeconfig``, printed (only
    the lines holding ``grep``, if given)."""
    shown = f" | grep {shlex.quote(grep)}" if grep else ""
    say("    $ kubectl agentrun " + shlex.join(args) + shown + f"      # as user {APPROVER}")
    out = subprocess.run(
        [sys.executable, "-m", "durable_agents.kubectl.main", *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)
    lines = [line for line in out.stdout.rstrip().splitlines() if grep is None or grep in line]
    say("\n".join("    " + (line if len(line) <= LONG else line[:LONG] + " ...") for line in lines))


def stamped(runs: Runs, name: str, request_id: str) -> None:
    decided = runs.get(name)["spec"]["approvals"][request_id]
    say(
        f"    stamped by the admission webhook: approver {decided['approver']['username']!r} "
        f"at {decided['decidedAt']} (asked a SubjectAccessReview for verb approve)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timeline(run: dict[str, Any]) -> str:
    rows = [f"    {'VERSION':>7}  {'EVENT':<18} {'FROM':<18} {'TO':<18} DETAIL"]
    for h in run["status"]["history"]:
        moved = f"{h['event']:<18} {h['from']:<18} {h['to']:<18}"
        rows.append(f"    {h['stateVersion']:>7}  {moved} {h.get('detail', '')}")
    return "\n".join(rows)


def agent_manifest(
    repo: Path, model: ModelServerThread, system: ReferenceSystemThread, key: str
) -> list[Any]:
    """The sample's objects, pointed at the reference model server and the reference system."""
    docs = [doc for doc in yaml.safe_load_all((repo / MODEL_SAMPLE).read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "Secret":
            doc["stringData"] = {**doc.get("stringData", {}), "apiKey": key}
        elif doc["kind"] == "AgentRun":
            agent = doc["spec"]["agent"]
            agent["endpoint"]["baseUrl"] = model.base_url
            for tool in agent["tools"]:
                if "effect" in tool:
                    effects = f"{system.url}/effects"
                    tool["effect"]["target"] = {"url": effects, "queryUrl": effects}
    return docs


def show_proposal(run: dict[str, Any]) -> None:
    """What the model proposed and the facts the approval request binds (nothing sealed opened)."""
    request = run["status"]["approvalRequest"]
    proposal = request.get("proposal") or {}
    call = f"model call {proposal.get('callId')}, turn {proposal.get('turn')}"
    say(f"    tool:            {proposal.get('tool')} ({call})")
    say(f"    effect:          {request['effect']} ({request['tier']})")
    say(f"    target:          {json.dumps(request.get('target'), sort_keys=True)}")
    say("    arguments:       (sealed; approvers see them with kubectl agentrun status --reveal, below)")
    say("    model's words:   (sealed)")
    say(f"    request:         {request['requestId']}, digest {request['digest']}")
    say(f"    policy version:  {request.get('policyVersion')} ({request.get('policyReason')})")
    say(f"    runs as:         serviceaccount {request.get('serviceAccount', '-')}")
    known = {e.get("id"): e for e in run["status"]["checkpoint"].get("evidence") or []}
    say("    evidence:        (status.checkpoint.evidence; ID, object read, content digest)")
    for evidence_id in request.get("evidence") or []:
        e = known.get(evidence_id) or {}
        where = f"{e.get('kind')}/{e.get('name')}@{e.get('resourceVersion')}" if e.get("kind") else "-"
        say(f"      {evidence_id}  {where}  {e.get('contentDigest', '(not in the checkpoint)')}")


def show_agent_facts(done: dict[str, Any], model: ModelServerThread) -> None:
    facts = done["status"]["checkpoint"]["agent"]
    say(f"    model:           {facts.get('model')}")
    say(f"    prompt digest:   {facts.get('promptDigest')}")
    say(f"    tool-set digest: {facts.get('toolSetDigest')}")
    say(f"    {'TURN':>4}  {'TOOL':<12} {'OUTCOME':<10} {'TOKENS IN/OUT':<14} {'MODEL CALLS':<12} CALL")
    for n, turn in enumerate(facts.get("turns") or []):
        usage = turn.get("usage") or {}
        tokens = f"{usage.get('inputTokens', 0)}/{usage.get('outputTokens', 0)}"
        outcome = turn.get("outcome")
        shown = outcome if isinstance(outcome, str) else json.dumps(outcome, sort_keys=True)
        say(
            f"    {turn.get('index', n):>4}  {turn.get('tool', '-'):<12} {shown:<10} {tokens:<14} "
            f"{turn.get('modelCalls', '-')!s:<12} {turn.get('callId', '-')}"
        )
    total = facts.get("usageTotal") or {}
    say(
        f"    model calls:     {facts.get('modelCallsTotal')} recorded (the last one answered), "
        f"{model.calls().get('total')} served by the reference model server"
    )
    say(f"    tokens in total: {total.get('inputTokens', 0)} in, {total.get('outputTokens', 0)} out")


def agent_act(env: KubeEnv, kc: list[str], runs: Runs, ns: str, repo: Path, work: Path) -> None:
    """The model planner: read evidence, propose a refund, wait for a bound approval, apply it once."""
    script = yaml.safe_load((repo / MODEL_SCRIPT).read_text())
    key = f"sk-demo-{uuid.uuid4().hex}"
    with ModelServerThread(script, api_key=key) as model, ReferenceSystemThread() as system:
        step("act 2: a run driven by the model planner (an OpenAI-compatible endpoint)")
        say(f"    the reference model server {model.base_url} plays the script {MODEL_SCRIPT}")
        say(f"    the reference system {system.url} counts the refunds it receives")
        docs = agent_manifest(repo, model, system, key)
        if env.plane is None:
            say("    (no approvals on this cluster, as above: the refunds policy asks for none here)")
            policy = next(doc for doc in docs if doc["kind"] == "AgentPolicy")
            policy["spec"]["approvalRequiredTiers"] = []
        manifest = work / "agentrun-model.yaml"
        manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        say(
            f"    {MODEL_SAMPLE}, with the run's baseUrl at the model server, the refund tool's target "
            "at the reference system, and the Secret's apiKey set to the model server's key (not shown):"
        )
        say(kubectl(kc, "-n", ns, "apply", "-f", str(manifest)).rstrip())
        name = "refund"
        if env.plane is not None:
            parked = runs.wait_state(name, "waiting_approval", timeout=Within.RUN)
            step("the model read the limits and proposed a refund; the run waits for an approval bound to:")
            show_proposal(parked)
            applied = system.total()
            say(f"    refunds at the reference system so far: {applied}")
            if applied:
                raise SystemExit("the refund reached the reference system before its approval")
            approver_config = approver_kubeconfig(env, ns)
            kubectl_agentrun(approver_config, "status", name, "-n", ns, "--reveal")
            request = parked["status"]["approvalRequest"]
            decision = {request["requestId"]: {"digest": request["digest"], "decision": "approve"}}
            approver = [kc[0], "--kubeconfig", str(approver_config)]
            step("approving exactly that request (its digest) by patching the run's spec")
            patch = json.dumps({"spec": {"approvals": decision}}, separators=(",", ":"))
            kubectl(approver, "-n", ns, "patch", "agentrun", name, "--type=merge", "-p", patch, who=APPROVER)
            stamped(runs, name, request["requestId"])
        done = runs.wait_state(name, "completed", "failed", timeout=Within.RUN)
        if done["status"]["state"] != "completed":
            raise SystemExit(
                f"the agent run ended {done['status']['state']}: {done['status'].get('outcome')}"
            )
        counts = system.counts()
        step("the reference system: the refund was applied once")
        applied_keys = ", ".join(f"key {k}: {n}" for k, n in counts.items())
        say(f"    effects applied: {sum(counts.values())} ({applied_keys})")
        if list(counts.values()) != [1]:
            raise SystemExit(f"the refund was not applied exactly once: {counts}")
        say(kubectl(kc, "-n", ns, "get", "actionrecords", "-o", "wide").rstrip())
        step("the agent's facts (status.checkpoint.agent)")
        show_agent_facts(done, model)
        step("the agent run's transition timeline")
        say(timeline(done))
        outcome = done["status"]["outcome"]
        say(f"\n    outcome: {outcome['reason']}: {outcome['message']}; the model's answer is sealed:")
        if env.plane is not None:
            kubectl_agentrun(approver_config, "status", name, "-n", ns, "--reveal", grep="answer, model says")


def main() -> int:
    repo = find_repo_root()
    if repo is None:
        raise SystemExit("run the demo from a checkout of durable-agents (make demo)")
    ns = f"demo-{uuid.uuid4().hex[:4]}"
    with cluster() as (env, kc), tempfile.TemporaryDirectory() as logs:
        step("installing the CRDs (generated from the pydantic API types)")
        for name in install_crds(env.api, repo / "crds"):
            say(f"    {name}")
        step(f"namespace {ns}: a ConfigMap to read; the run's ServiceAccount may read it and write one")
        prepare_namespace(env, ns)
        kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentpolicy-default.yaml"))
        if env.plane is None:
            say("    (this cluster's API server cannot reach a webhook on this machine's loopback:")
            say("     approvals are switched off for the demo; install the chart for the real thing)")
            kubectl(
                kc,
                "-n",
                ns,
                "patch",
                "agentpolicy",
                "default",
                "--type=merge",
                "-p",
                '{"spec":{"approvalRequiredTiers":[]}}',
            )

        step("starting the operator (its own user, bound to the chart's ClusterRole)")
        webhook_port = _free_port()
        extra = {"DURABLE_AGENTS_NAMESPACE": ns}
        if env.plane is not None:  # the API server must reach the webhook: on loopback here
            extra["DURABLE_AGENTS_WEBHOOK_PORT"] = str(webhook_port)
        op = OperatorProcess(
            operator_kubeconfig(env, repo),
            Path(logs),
            name="demo-operator",
            lease_duration=15,
            env=extra,
        ).start()
        if env.plane is not None:
            eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
        say(f"    operator {op.identity} (pid {op.pid}) is watching namespace {ns}")
        try:
            runs = Runs(env, ns)
            if env.plane is not None:
                runs.await_webhook()  # the run is applied with kubectl: the webhook stamps it
            step(
                "applying the run: read the settings, ask the on-call engineer, await the window, "
                "change the configuration once, complete"
            )
            kubectl(kc, "-n", ns, "apply", "-f", str(repo / "config/samples/agentrun-rollout.yaml"))
            name = "rollout"
            parked = runs.wait_state(name, "waiting_input", timeout=60)
            question = parked["status"]["checkpoint"]["pendingInput"]["question"]
            say(f"    the run is parked in waiting_input (no worker holds it): {question!r}")
            say(kubectl(kc, "-n", ns, "get", "agentruns", show=True).rstrip())

            step("answering the question by patching the run's spec")
            patch_spec(kc, ns, name, '{"spec":{"answers":{"confirm":"yes"}}}')
            runs.wait_state(name, "waiting_external", timeout=60)
            say("    the run resumed, and now waits for the event maintenance-window-open")

            step("delivering the external event")
            patch_spec(kc, ns, name, '{"spec":{"events":{"maintenance-window-open":"opened by the demo"}}}')
            if env.plane is not None:
                approve(env, runs, ns, name)
            done = runs.wait_state(name, "completed", timeout=60)

            step(
                "the run's transition timeline (status.history; stateVersion +1 per transition, "
                "written at semantic boundaries)"
            )
            say(timeline(done))
            cp = done["status"]["checkpoint"]
            ev = next(e for e in cp["evidence"] if e.get("source") == "kubernetes")
            say(
                f"\n    evidence: {ev['kind']}/{ev['name']} at resourceVersion {ev['resourceVersion']} "
                f"({ev['contentDigest'][:23]}...)"
            )
            step("the action ledger: the configuration change, applied once, as the run's ServiceAccount")
            say(kubectl(kc, "-n", ns, "get", "actionrecords", "-o", "wide").rstrip())
            say(
                kubectl(
                    kc,
                    "-n",
                    ns,
                    "get",
                    "configmap",
                    "rollout-strategy",
                    "-o",
                    "jsonpath={.data} key={.metadata.annotations.durable-agents\\.io/idempotency-key}",
                ).rstrip()
            )
            step("the completed run")
            say(kubectl(kc, "-n", ns, "get", "agentruns", "-o", "wide").rstrip())
            say(f"\n    outcome: {done['status']['outcome']}")
            agent_act(env, kc, runs, ns, repo, Path(logs))
        finally:
            op.stop()
            if env.plane is None:
                client.CoreV1Api(env.api).delete_namespace(ns)
        step("stopped the operator" + ("" if env.plane is None else " and the local control plane"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
