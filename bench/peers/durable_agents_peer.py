"""durable-agents: the operator (a separate process, its own user with the chart's RBAC rules,
cluster-wide, admission webhook on) on the project's local control plane with etcd fsync ON.

The workload, mapped to what the scripted planner has (it has no pure-computation step kind):

* ``reads`` mapping (system ``durable-agents``): steps 1-4, 6, 7 and 9 are ``read`` steps (a
  ConfigMap read as the run's ServiceAccount, recorded as evidence): each is one committed
  transition, so this is what our model commits today for a step that does work. Steps 5 and 8
  are ONE ``effect`` step (``http.post``): the AgentPolicy makes ``http.post`` consequential, so
  the run parks in ``waiting_approval`` and the approval is bound to the digest of exactly that
  POST; in our model an approval is always an approval of an action, so the pause of step 5
  happens where the action is (the order of steps 6-7 and the POST is swapped; nothing measured
  depends on it). Step 10 is ``complete``.
* ``boundaries`` mapping (system ``durable-agents-boundaries``): the pure computations are
  replayable and need no commit, so they are left out; the run is the approval-gated POST and
  ``complete``. This is what committing only at semantic boundaries would cost; it is a model of
  a planner that computes in memory, not a feature the operator has.
* ``model`` mapping (system ``durable-agents-model``): what a user of this operator writes for this
  workload: the model planner (``spec.agent``) driven by the reference model server
  (:mod:`durable_agents_testkit.modelserver`, a child process of this worker, scripted by
  :func:`model_script`), the computations being model calls between semantic boundaries. Two tools:
  ``read_input`` (a ``read`` of a ConfigMap by name, non-consequential) and ``post_result`` (the
  ``http.post`` effect, consequential by the same AgentPolicy). Eight model calls per run, where
  the eight computations stand: calls 1-3 read ``peer-step-1..3``, call 4 proposes the POST (the run
  parks in ``waiting_approval``, the approval bound to that POST's digest, as above), and after its
  outcome calls 5-7 read ``peer-step-6``, ``-7``, ``-9`` and call 8 is the final answer (the run
  completes). A model call is no commit of its own: what the model proposed is written with the
  next boundary, or before a call that would pass the policy's bound of calls between two writes
  (default 4). The model server's calls are counted (``GET /calls``) and its CPU is reported apart,
  not in the system's CPU: it stands in for a remote model.

The driver (20 threads) creates each run as the admin, waits (a watch on all AgentRuns) until it is
parked in ``waiting_approval``, patches ``spec.approvals[requestId]`` with the request's digest as
an ordinary user allowed the ``approve`` verb (the admission webhook stamps approver and time and
checks the SubjectAccessReview), and waits for ``completed``. ``delivered``: the patch returned
(admitted and stored in etcd). ``resumed``: the watch delivered the next committed state.

Durable commits: every successful write request in the run's namespace in the API server's audit
log (each one an etcd transaction, fsync'd), including the driver's create and approval patch, plus
the region's shard and member Lease writes in the Lease namespace during the repetition; the
operator's own ``durable_agents_api_writes_total`` and etcd's WAL fsyncs are reported alongside.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

import durable_agents
from bench.peers.worker import PeerSystem, serve
from bench.peers.workload import RepResult, RunTiming
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import idempotency_key
from durable_agents_testkit.audit import AuditEntry, audit_offset, read_audit
from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.demo import operator_kubeconfig
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane, find_repo_root
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.operator_rights import leases_only, manage
from durable_agents_testkit.scrape import free_port

APPROVER = "bench-approver"
APPROVERS_GROUP = "agentrun-approvers"
POLICY = "peer"
CONFIGMAP = "peer-input"
POST = "approve-and-post"
MAPPINGS = ("reads", "boundaries", "model")
RUN_TIMEOUT = 180.0
# The model mapping: the model planner and the reference model server.
MODEL = "peer-model"
MODEL_PROMPT = "peer-agent-prompt"
MODEL_SECRET = "peer-model-key"
MODEL_API_KEY = "sk-peer-bench"
MODEL_SERVER = "reference model server"  # its label in cpu_by_process
READ_TOOL = "read_input"
POST_TOOL = "post_result"
READS_BEFORE, READS_AFTER = (1, 2, 3), (6, 7, 9)  # the workload steps the model's reads stand for
# 3 reads, the POST proposed, 3 reads after its outcome, the final answer.
MODEL_CALLS = len(READS_BEFORE) + 1 + len(READS_AFTER) + 1
MODEL_TURNS = [READ_TOOL] * len(READS_BEFORE) + [POST_TOOL] + [READ_TOOL] * len(READS_AFTER)
PROMPT = (
    "You run the peer workload. Read the inputs peer-step-1, peer-step-2 and peer-step-3 one at a "
    "time with read_input, then post the result with post_result (a person approves it first). "
    "Once it is posted, read peer-step-6, peer-step-7 and peer-step-9, then say that you are done."
)


def api_client(kubeconfig: Path, pool: int = 40) -> client.ApiClient:
    """A client whose connection pool serves the driver's threads without reconnecting."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def _input(step: int) -> str:
    """The ConfigMap the model reads for the workload's step ``step`` (model mapping)."""
    return f"peer-step-{step}"


def model_script() -> dict[str, Any]:
    """The reference model server's script (model mapping). The first rule whose condition holds
    answers, and the conditions see only the run's own conversation (the tools called so far, the
    last tool result), so one script serves every run at once: each read names the next input,
    and the POST's outcome leads to the reads after it."""

    def call(tool: str, arguments: dict[str, Any], when: dict[str, Any], content: str) -> dict[str, Any]:
        return {"when": when, "content": content, "toolCalls": [{"name": tool, "arguments": arguments}]}

    def read(step: int, when: dict[str, Any]) -> dict[str, Any]:
        return call(READ_TOOL, {"name": _input(step)}, when, f"Next, the input of step {step}.")

    before, after = {"notCalled": [POST_TOOL]}, {"called": [POST_TOOL]}
    first, last = READS_BEFORE[-1], READS_AFTER[-1]
    return {
        "model": MODEL,
        "rules": [
            read(READS_BEFORE[0], {"notCalled": [READ_TOOL]}),
            *[
                read(n, {**before, "lastToolResultContains": _input(p)})
                for p, n in itertools.pairwise(READS_BEFORE)
            ],
            call(
                POST_TOOL,
                {"workloadStep": 8},
                {**before, "lastToolResultContains": _input(first)},
                "The inputs are read: post the result.",
            ),
            *[
                read(n, {**after, "lastToolResultContains": _input(p)})
                for p, n in itertools.pairwise(READS_AFTER)
            ],
            {
                "when": {**after, "lastToolResultContains": _input(last)},
                "content": "Done: the result is posted.",
            },
            # The POST's outcome (the last tool result): the reads after it begin.
            read(READS_AFTER[0], {**after, "lastToolResultContains": '"outcome":"succeeded"'}),
        ],
    }


def agent_spec(refsystem_url: str, model_url: str) -> dict[str, Any]:
    """The model mapping's AgentRun spec: the model planner, a read tool and the POST tool."""
    post = {
        "effect": "http.post",
        "target": _target(refsystem_url),
        "parameters": {
            "type": "object",
            "properties": {"workloadStep": {"type": "integer"}},
            "required": ["workloadStep"],
            "additionalProperties": False,
        },
    }
    tools = [
        {
            "name": READ_TOOL,
            "description": "Read one of the workload's input ConfigMaps by name.",
            "read": {"apiVersion": "v1", "kind": "ConfigMap"},
        },
        {"name": POST_TOOL, "description": "POST the result. A person approves it first.", "effect": post},
    ]
    endpoint = {
        "baseUrl": model_url,
        "credentialsSecretRef": {"name": MODEL_SECRET, "key": "apiKey"},
        "timeout": "30s",
    }
    return {
        "taskType": "peer-bench",
        "objective": "the peer workload: 10 steps, an approval, one POST",
        "policyRef": {"name": POLICY},
        "agent": {
            "planner": "model",
            "model": MODEL,
            "endpoint": endpoint,
            "systemPrompt": {"name": MODEL_PROMPT, "key": "v1"},
            "tools": tools,
        },
    }


def _target(refsystem_url: str) -> dict[str, str]:
    return {"url": f"{refsystem_url}/effects", "queryUrl": f"{refsystem_url}/effects"}


def run_spec(refsystem_url: str, mapping: str, model_url: str = "") -> tuple[dict[str, Any], int | None]:
    """The AgentRun spec of the workload and the index of its effect step (None for the model
    mapping: the model's call decides which step it is)."""
    if mapping == "model":
        return agent_spec(refsystem_url, model_url), None

    def read(step: int) -> dict[str, Any]:
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": CONFIGMAP}
        return {"name": f"compute-{step}", "read": {"object": ref}}

    post = {
        "name": POST,
        "effect": {"effect": "http.post", "target": _target(refsystem_url), "arguments": {"workloadStep": 8}},
    }
    done = {"name": "done", "complete": {"result": "ok"}}
    if mapping == "reads":
        steps = [read(1), read(2), read(3), read(4), post, read(6), read(7), read(9), done]
    elif mapping == "boundaries":
        steps = [post, done]
    else:
        raise ValueError(f"unknown mapping {mapping!r}")
    spec = {
        "taskType": "peer-bench",
        "objective": "the peer workload: 10 steps, an approval, one POST",
        "policyRef": {"name": POLICY},
        "steps": steps,
    }
    return spec, steps.index(post)


ETCD_METRICS = ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_mvcc_put_total")
LEASE_NAMESPACE = "default"  # where the bench operator keeps its region's shard and member Leases


class RunWatch:
    """Every AgentRun change, as the watch delivers it, with the local time it arrived."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.cond = threading.Condition()
        self.latest: dict[tuple[str, str], dict[str, Any]] = {}
        # (namespace, name) -> {stateVersion: first time seen}
        self.seen: dict[tuple[str, str], dict[int, float]] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="agentrun-watch", daemon=True)

    def start(self) -> RunWatch:
        self.thread.start()
        return self

    def _main(self) -> None:
        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    listing = self.custom.list_cluster_custom_object(GROUP, VERSION, "agentruns")
                    rv = listing["metadata"]["resourceVersion"]
                    for obj in listing["items"]:
                        self._record(obj)
                w = watch.Watch()
                for event in w.stream(
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    "agentruns",
                    resource_version=rv,
                    timeout_seconds=120,
                    allow_watch_bookmarks=True,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""  # expired: list again
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._record(obj)
                    if self.stopping.is_set():
                        break
            except ApiException as err:
                if err.status == 410:
                    rv = ""
                    continue
                if not self.stopping.is_set():
                    time.sleep(0.2)
            except Exception as err:  # a dropped connection: resume from the last resourceVersion
                if self.stopping.is_set():
                    return
                self.error = err
                time.sleep(0.2)

    def _record(self, obj: dict[str, Any]) -> None:
        now = time.time()
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        version = int((obj.get("status") or {}).get("stateVersion") or 0)
        with self.cond:
            self.latest[key] = obj
            self.seen.setdefault(key, {}).setdefault(version, now)
            self.cond.notify_all()

    def wait(self, key: tuple[str, str], predicate: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                obj = self.latest.get(key)
                if obj is not None and predicate(obj):
                    return obj
                left = deadline - time.monotonic()
                if left <= 0:
                    status = (obj or {}).get("status") or {}
                    raise TimeoutError(
                        f"{key[1]} is {status.get('state')!r} at v{status.get('stateVersion')} "
                        f"after {timeout:.0f}s ({status.get('outcome')})"
                    )
                self.cond.wait(left)

    def first_seen(self, key: tuple[str, str], version: int) -> float:
        with self.cond:
            return self.seen[key][version]

    def versions(self, key: tuple[str, str]) -> dict[int, float]:
        with self.cond:
            return dict(self.seen[key])

    def forget(self, namespace: str) -> None:
        with self.cond:
            for key in [k for k in self.latest if k[0] == namespace]:
                self.latest.pop(key, None)
                self.seen.pop(key, None)

    def stop(self) -> None:
        self.stopping.set()


def read_audit_from(path: Path, offset: int, since: datetime) -> list[AuditEntry]:
    """Write requests in the audit log from byte ``offset`` on (the log only grows)."""
    return [e for e in read_audit(path, offset=offset, since=since) if e.is_write]


def _state(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("state") or "")


def _version(obj: dict[str, Any]) -> int:
    return int((obj.get("status") or {}).get("stateVersion") or 0)


def _metrics(url: str, prefixes: tuple[str, ...], context: ssl.SSLContext | None = None) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


class ModelServerProcess:
    """The reference model server (``python -m durable_agents_testkit.modelserver``) playing
    :func:`model_script`, as a child process of this worker: the orchestrator measures its CPU
    apart from the system's, since it stands in for a remote model."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        script = work / "model-script.json"
        script.write_text(json.dumps(model_script(), indent=1))
        self._log = (work / "modelserver.log").open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable_agents_testkit.modelserver",
                "--script",
                str(script),
                "--api-key",
                MODEL_API_KEY,
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # the one line it prints: its base URL
        if not line.startswith("http"):
            self.stop()
            raise RuntimeError(f"the reference model server did not start (see {work / 'modelserver.log'})")
        self.base_url = line
        self.url = line.removesuffix("/v1")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def calls(self) -> tuple[int, int]:
        """(completions served, of which unmatched by the script), from ``GET /calls``."""
        with urllib.request.urlopen(f"{self.url}/calls", timeout=30) as response:
            calls = json.load(response)
        return int(calls["total"]), int(calls["unmatched"])

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.proc.kill()  # nothing once it has exited (Popen signals only a running child)
        self.proc.wait(10)
        self._log.close()


def _check_model_run(done: dict[str, Any]) -> None:
    """A model run did what the script says: its facts record every model call and tool call."""
    facts = done["status"]["checkpoint"]["agent"]
    turns = [turn["tool"] for turn in facts["turns"]]
    if facts["modelCallsTotal"] != MODEL_CALLS or turns != MODEL_TURNS:
        raise AssertionError(f"the model run recorded {facts['modelCallsTotal']} model calls, turns {turns}")


def _model_calls(model: ModelServerProcess, before: tuple[int, int], runs: int) -> dict[str, Any]:
    """The model calls of a repetition as the model server served them, and as the runs record them."""
    total, unmatched = model.calls()
    served = total - before[0]
    return {
        "model_calls": {
            "served": served,
            "per_run": round(served / runs, 2) if runs else None,
            "unmatched_by_script": unmatched - before[1],
            "recorded_per_run": MODEL_CALLS,
            "note": "served: completions the reference model server answered (GET /calls) during the "
            "repetition; recorded: status.checkpoint.agent.modelCallsTotal, checked for every completed "
            "run. A unit of work decided again (a 409 on its write) repeats its model calls.",
        }
    }


class DurableAgentsPeer(PeerSystem):
    name = "durable-agents"

    def setup(self) -> dict[str, Any]:
        repo = find_repo_root()
        if repo is None:
            raise RuntimeError("run from a checkout of durable-agents")
        self.repo = repo
        self.work = Path(self.config.get("work_dir") or tempfile.mkdtemp(prefix="peers-da-"))
        started = time.monotonic()
        self.plane = LocalControlPlane(fsync=True, audit=True)
        self.plane.start()
        plane_seconds = time.monotonic() - started
        env = KubeEnv.local(self.plane)
        install_crds(env.api, Path(self.config.get("crd_dir") or repo / "crds"))  # a base row: its own
        self.api = api_client(Path(self.plane.kubeconfig_path))
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self._grant_approvers()
        approver = self.plane.write_user_kubeconfig(APPROVER, [APPROVERS_GROUP])
        self.approver = client.CustomObjectsApi(api_client(Path(approver)))
        self.metrics_port = free_port()
        self.workers = int(self.config.get("operator_workers", 20))
        self.lease_duration = int(self.config.get("lease_duration", 15))
        operator_env = {
            "DURABLE_AGENTS_WEBHOOK_PORT": str(free_port()),
            "DURABLE_AGENTS_METRICS_PORT": str(self.metrics_port),
            "DURABLE_AGENTS_WORKERS": str(self.workers),
            "DURABLE_AGENTS_LEASE_NAMESPACE": LEASE_NAMESPACE,
        }
        if self.config.get("operator_pythonpath"):  # run.py --base: another revision's operator
            operator_env["PYTHONPATH"] = str(self.config["operator_pythonpath"])
        kubeconfig = operator_kubeconfig(env, repo)
        leases_only(env, LEASE_NAMESPACE)  # namespaces opt in: the operator's own Leases are here
        self.operator = OperatorProcess(
            kubeconfig,
            self.work / "operator",
            name="bench-operator",
            lease_duration=self.lease_duration,
            env=operator_env,
        ).start()
        operator = self.operator
        eventually(lambda: operator.logged("admission webhook serving"), Within.TAKEOVER, "the webhook")
        self.watch = RunWatch(api_client(Path(self.plane.kubeconfig_path), pool=2)).start()
        # Only when this invocation measures the model mapping (run.py says which it will).
        self.model = (
            ModelServerProcess(self.work / "model") if "model" in self.config.get("variants", ()) else None
        )
        uncounted = {str(self.model.pid): MODEL_SERVER} if self.model is not None else {}
        return {
            "versions": {
                "durable-agents": durable_agents.__version__,
                **(
                    {"operator revision": self.config["operator_revision"]}
                    if self.config.get("operator_revision")
                    else {}
                ),
                "kopf": importlib.metadata.version("kopf"),
                "kubernetes (python client)": importlib.metadata.version("kubernetes"),
                "control plane binaries": self.plane.bin_dir.name,
            },
            "settings": {
                "etcd_fsync": self.plane.fsync,
                "audit_log": "blocking, metadata level",
                "admission_webhook": True,
                "operator_workers": self.workers,
                "lease_duration_seconds": self.lease_duration,
                "operator_user": "durable-agents-operator (the chart's ClusterRole rules)",
                "control_plane_start_seconds": round(plane_seconds, 1),
            },
            "mapping": {
                **{
                    m: [s.get("name") for s in run_spec("http://x", m)[0]["steps"]]
                    for m in MAPPINGS
                    if m != "model"
                },
                "model": {
                    "tools": {READ_TOOL: "read (ConfigMap, by name)", POST_TOOL: "http.post (consequential)"},
                    "turns": MODEL_TURNS,
                    "model_calls": MODEL_CALLS,
                    "script": model_script(),
                },
            },
            # Processes of this worker that stand for something remote: the orchestrator reports
            # their CPU in cpu_by_process under this label but not in the system's cpu_seconds.
            "uncounted_processes": uncounted,
            # What `--profile` (make profile) records with py-spy: the operator (its webhook child too).
            "operator_pid": self.operator.pid,
            # ... and kube-apiserver's Go profile, read with the admin's credentials.
            "apiserver_kubeconfig": str(self.plane.kubeconfig_path),
        }

    def _grant_approvers(self) -> None:
        rule = {
            "apiGroups": [GROUP],
            "resources": ["agentruns"],
            "verbs": ["get", "list", "patch", "approve"],
        }
        self.rbac.create_cluster_role({"metadata": {"name": "bench-approver"}, "rules": [rule]})
        self.rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "bench-approvers"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "bench-approver",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": APPROVERS_GROUP}
                ],
            }
        )

    def _grant_run(self, ns: str, role: str, resource: str, names: list[str]) -> None:
        """The run's ServiceAccount (``default``) may get exactly these objects."""
        rule = {"apiGroups": [""], "resources": [resource], "verbs": ["get"], "resourceNames": names}
        self.rbac.create_namespaced_role(ns, {"metadata": {"name": role}, "rules": [rule]})
        self.rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
            },
        )

    def _prepare_agent(self, ns: str) -> None:
        """What the model planner needs besides: the inputs the model reads, the prompt, the key."""
        inputs = [_input(step) for step in (*READS_BEFORE, *READS_AFTER)]
        for name in inputs:
            self.core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"input": name}})
        self.core.create_namespaced_config_map(
            ns, {"metadata": {"name": MODEL_PROMPT}, "data": {"v1": PROMPT}}
        )
        secret = {"metadata": {"name": MODEL_SECRET}, "stringData": {"apiKey": MODEL_API_KEY}}
        self.core.create_namespaced_secret(ns, secret)
        self._grant_run(ns, "peer-agent", "configmaps", [MODEL_PROMPT, *inputs])
        self._grant_run(ns, "peer-agent-key", "secrets", [MODEL_SECRET])

    def _prepare_namespace(self, ns: str, mapping: str) -> None:
        self.core.create_namespace({"metadata": {"name": ns}})
        manage(self.api, ns)  # opted in: the operator may act there
        self.core.create_namespaced_config_map(ns, {"metadata": {"name": CONFIGMAP}, "data": {"x": "1"}})
        self._grant_run(ns, "peer-read", "configmaps", [CONFIGMAP])
        if mapping == "model":
            self._prepare_agent(ns)
        policy = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentPolicy",
            "metadata": {"name": POLICY},
            "spec": {
                "version": "v1",
                "tiers": {"http.post": "consequential"},
                "approvalRequiredTiers": ["consequential"],
            },
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "agentpolicies", policy)

    def _one(self, ns: str, name: str, spec: dict[str, Any], post_index: int | None) -> RunTiming:
        """One run; ``post_index`` None: a model run, whose POST is the step the model proposed."""
        timing = RunTiming(run_id=f"{ns}/{name}")
        key = (ns, name)
        try:
            timing.started = time.time()
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun", "metadata": {"name": name}}
            # The operator's webhook stamps the create (the run's ServiceAccount may be used).
            created = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, "agentruns", {**body, "spec": spec}
            )
            uid = created["metadata"]["uid"]
            if post_index is not None:
                timing.key = idempotency_key(uid, post_index, POST)
            parked = self.watch.wait(
                key, lambda o: _state(o) in ("waiting_approval", "failed", "completed"), RUN_TIMEOUT
            )
            if _state(parked) != "waiting_approval":
                raise AssertionError(f"expected waiting_approval, got {_state(parked)}")
            timing.paused = self.watch.first_seen(key, _version(parked))
            request = parked["status"]["approvalRequest"]
            if post_index is None:  # the model's call is step agent-<index>
                step = request["step"]
                timing.key = idempotency_key(uid, int(step.rsplit("-", 1)[1]), step)
            decision = {"digest": request["digest"], "decision": "approve", "reason": "bench"}
            self.approver.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                "agentruns",
                name,
                {"spec": {"approvals": {request["requestId"]: decision}}},
            )
            timing.delivered = time.time()
            parked_version = _version(parked)
            moved = self.watch.wait(key, lambda o: _version(o) > parked_version, RUN_TIMEOUT)
            # The first commit after the wait (watch events may skip a version under load).
            timing.resumed = min(
                t for v, t in self.watch.versions(key).items() if parked_version < v <= _version(moved)
            )
            done = self.watch.wait(
                key, lambda o: _state(o) in ("completed", "failed", "canceled"), RUN_TIMEOUT
            )
            timing.finished = self.watch.first_seen(key, _version(done))
            if _state(done) != "completed":
                raise AssertionError(f"ended {_state(done)}: {done['status'].get('outcome')}")
            decided = done["spec"]["approvals"][request["requestId"]]
            if (decided.get("approver") or {}).get("username") != APPROVER:
                raise AssertionError(f"the approval was not stamped by the webhook: {decided}")
            if post_index is None:
                _check_model_run(done)
            timing.ok = True
        except Exception as err:
            timing.finished = timing.finished or time.time()
            timing.error = f"{type(err).__name__}: {err}"
        return timing

    def _leases(self, ns: str) -> int:
        """Per-run Leases left in the runs' namespace (this release makes none)."""
        api = client.CoordinationV1Api(self.api)
        return len(api.list_namespaced_lease(ns, label_selector="durable-agents.io/run").items)

    def run_rep(self, rep: int, runs: int, in_flight: int, variant: str | None = None) -> RepResult:
        mapping = variant or "reads"
        system = self.name if mapping == "reads" else f"{self.name}-{mapping}"
        ns = f"peers-{mapping[:5]}-r{rep}-{uuid.uuid4().hex[:5]}"
        self._prepare_namespace(ns, mapping)
        model = self.model if mapping == "model" else None
        if mapping == "model" and model is None:
            raise RuntimeError(
                "the model mapping needs the model server: start the worker with variants [model]"
            )
        spec, post_index = run_spec(self.refsystem_url, mapping, model.base_url if model is not None else "")
        calls_before = model.calls() if model is not None else (0, 0)
        operator_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        etcd_url = f"{self.plane.etcd_url}/metrics"
        op_before = _metrics(
            operator_url, ("durable_agents_api_writes_total", "durable_agents_transitions_total")
        )
        etcd_before = _metrics(etcd_url, ETCD_METRICS, self.plane.etcd_ssl_context())
        window_start = datetime.now(UTC)
        offset = audit_offset(self.plane.audit_log_path)
        names = [f"run-{i}" for i in range(runs)]
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            timings = list(pool.map(lambda n: self._one(ns, n, spec, post_index), names))
        # Let the last Lease deletions and Events land before counting. A Lease whose delete was
        # refused (409: renewed meanwhile) stays until the operator reaps it: reported, not awaited.
        with contextlib.suppress(TimeoutError):
            eventually(lambda: self._leases(ns) == 0, Within.MOMENT, "the runs' Leases to be released")
        leftover = self._leases(ns)
        writes = self._settled_writes(ns, window_start, offset)
        op_after = _metrics(
            operator_url, ("durable_agents_api_writes_total", "durable_agents_transitions_total")
        )
        etcd_after = _metrics(etcd_url, ETCD_METRICS, self.plane.etcd_ssl_context())
        extra = _model_calls(model, calls_before, runs) if model is not None else {}
        ok = [e for e in writes if 200 <= e.code < 300]
        window_seconds = (datetime.now(UTC) - window_start).total_seconds()
        # The region's Leases (in the operator's Lease namespace) are kept whatever the runs do: the
        # replica's liveness renewed, a shard Lease written when it changes hands. Their writes in
        # this window are counted too, shared by its runs.
        window = read_audit(self.plane.audit_log_path, offset=offset, since=window_start)
        region = [
            e
            for e in window
            if e.is_write and e.namespace == LEASE_NAMESPACE and e.what == "leases" and 200 <= e.code < 300
        ]
        by_kind = Counter(f"{e.user} {e.verb} {e.what}" for e in ok)
        # Reads and watches too (any namespace): the API server's CPU is not only its writes.
        reads = Counter(f"{e.user} {e.verb} {e.what}" for e in window if not e.is_write)
        refused = Counter(f"{e.user} {e.verb} {e.what} {e.code}" for e in writes if e.code >= 300)
        op_delta = _delta(op_after, op_before)
        detail = {
            "audit_writes_by_kind": dict(by_kind.most_common()),
            "refused_writes": dict(refused),
            "audit_reads_by_kind": dict(reads.most_common()),
            "operator_metric_delta": op_delta,
            "etcd_delta": _delta(etcd_after, etcd_before),
            "leases_left_after_runs": leftover,
            "region_lease_writes": len(region),
            # Lease upkeep apart: per minute of the repetition, per replica (one replica here).
            "lease_writes_per_minute": round(len(region) * 60 / max(window_seconds, 1e-3), 1),
            "namespace": ns,
        }
        self.watch.forget(ns)
        commits = float(len(ok) + len(region))
        return RepResult.from_timings(system, rep, timings, in_flight, commits, detail, extra)

    def _settled_writes(self, ns: str, since: datetime, offset: int) -> list[AuditEntry]:
        """The namespace's write requests since ``since``, once their number stops growing."""
        previous = -1
        entries: list[AuditEntry] = []
        for _ in range(40):
            entries = [
                e for e in read_audit_from(self.plane.audit_log_path, offset, since) if e.namespace == ns
            ]
            if len(entries) == previous:
                break
            previous = len(entries)
            time.sleep(0.5)
        return entries

    def teardown(self) -> None:
        if self.model is not None:
            with contextlib.suppress(Exception):
                self.model.stop()
        with contextlib.suppress(Exception):
            self.watch.stop()
        with contextlib.suppress(Exception):
            self.operator.stop()
        self.plane.stop()


def main() -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return serve(DurableAgentsPeer)


if __name__ == "__main__":
    raise SystemExit(main())
