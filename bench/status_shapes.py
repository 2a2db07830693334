"""``make bench-status-shapes``: what one AgentRun status write costs, by the shape of the status
and of its CRD schema (issue 14, item 4).

One local control plane (etcd fsync ON, as ``bench.core``); 20 writers, one AgentRun each, each
PUTs ``.../status`` with the resourceVersion it last read. The statuses are real: a finished 8-step
run and an approval request, both written by the operator in this run. Schema variants are derived
in memory from crds/*agentruns*.yaml and applied to this throw-away control plane only. Shapes are
measured in rounds (every shape once per round) so that drift on a shared machine hits all alike.
Besides writes/s: CPU seconds per 1000 writes of kube-apiserver, etcd and this client process.

    .venv/bin/python -m bench.status_shapes --repeat 3 --out bench/results/status_shapes.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.core import (
    REPO,
    STEPS,
    Env,
    await_states,
    await_steps,
    bench_transitions,
    create_runs,
    environment,
    list_runs,
    proc_sample,
    summary,
)
from durable_agents import __version__
from durable_agents.api import crdgen
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.refsystem import ReferenceSystemThread

WRITERS = 20
MARKER = "benchVariant"  # a status field only the installed variant accepts: proves it is serving
OPAQUE: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


# --- schema variants (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    opaque_history: bool = False
    opaque_approval: bool = False
    no_cel: bool = False  # every x-kubernetes-validations rule removed
    spec_rules_in_crd: bool = False  # the CRD before issue 38: every spec rule in it, none in a policy
    atomic_checkpoint: bool = False  # status.checkpoint one field to managedFields, not one per leaf
    atomic_status: bool = False  # the whole status one field to managedFields


def strip_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [strip_cel(v) for v in node]
    return node


def variant_crd(base: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """The AgentRun CRD with the variant's status schema; ``base`` is left as it is."""
    crd = copy.deepcopy(documented_crd() if variant.spec_rules_in_crd else base)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        if variant.no_cel:
            schema = version["schema"]["openAPIV3Schema"] = strip_cel(schema)
        status = schema["properties"]["status"]["properties"]
        if variant.opaque_history:
            status["history"]["items"] = dict(OPAQUE)
        if variant.opaque_approval:
            status["approvalRequest"] = dict(OPAQUE)
        if variant.atomic_checkpoint:
            status["checkpoint"] = {**status["checkpoint"], "x-kubernetes-map-type": "atomic"}
        if variant.atomic_status:
            schema["properties"]["status"]["x-kubernetes-map-type"] = "atomic"
        status[MARKER] = {"type": "string", "enum": [variant.name]}
    return crd


def documented_crd() -> dict[str, Any]:
    """The AgentRun CRD with every spec rule where the API types declare it (as it was stored
    before the rules moved to the spec policy, api/spec_policy.py)."""
    (kind,) = [k for k in crdgen.KINDS if k.spec_rules_in_policy]
    return kind.crd(documented=True)


def load_base_crd() -> dict[str, Any]:
    (path,) = sorted((REPO / "crds").glob("*agentruns.yaml"))
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def size(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")))


# --- the statuses ------------------------------------------------------------------------------


def approval_request(env: Env) -> dict[str, Any]:
    """A real status.approvalRequest: one run stopped at a consequential effect by a policy."""
    namespace = env.namespace()
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "payments"},
        "spec": {
            "version": "v1",
            "tiers": {"http.post": "consequential"},
            "approvalRequiredTiers": ["consequential"],
        },
    }
    env.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", policy)
    with ReferenceSystemThread() as refsystem:
        op = env.operator(namespace, "approval-sample")
        try:
            pay = {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{refsystem.url}/effects", "queryUrl": f"{refsystem.url}/effects"},
                    "arguments": {"amount": 1, "currency": "EUR", "reference": "invoice-4711"},
                },
            }
            spec = {
                "taskType": "bench",
                "objective": "an approval request to measure",
                "policyRef": {"name": "payments"},
                "steps": [pay, {"name": "done", "complete": {"result": "ok"}}],
            }
            create_runs(env, namespace, {"a0": spec})
            await_states(env, namespace, "waiting_approval", 1, timeout=Within.TAKEOVER)
            (run,) = list_runs(env, namespace)
        finally:
            op.stop()
    request: dict[str, Any] = run["status"]["approvalRequest"]
    return request


def shapes_of(current: dict[str, Any], request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every status measured, by name (pure)."""
    no_history = {k: v for k, v in current.items() if k != "history"}
    bounded = {**current, "history": current["history"][-8:]}
    checkpoint = current.get("checkpoint") or {}
    checkpoint_as_string = {
        "schemaVersion": checkpoint.get("schemaVersion", 1),
        "document": json.dumps(checkpoint, separators=(",", ":"), ensure_ascii=False),
    }
    waiting = {**current, "state": "waiting_approval", "approvalRequest": request}
    return {
        "minimal": {"state": current["state"], "stateVersion": 1},
        "current": current,
        "no_history": no_history,
        "history_8": bounded,
        "with_approval": waiting,
        # Only the checkpoint as one string (the rest as it is): what a v4 checkpoint would save.
        "checkpoint_string": {**current, "checkpoint": checkpoint_as_string},
        "checkpoint_string_8": {**bounded, "checkpoint": checkpoint_as_string},
        "checkpoint_string_no_history": {**no_history, "checkpoint": checkpoint_as_string},
        # What the typed fields alone cost: the status without its checkpoint and history.
        "no_checkpoint_no_history": {k: v for k, v in no_history.items() if k != "checkpoint"},
        # The same bytes as `current`, one string in the (already opaque) checkpoint: the floor.
        "one_string": {
            "state": current["state"],
            "stateVersion": 1,
            "checkpoint": {"schemaVersion": 1, "blob": json.dumps(current)},
        },
    }


BASE = Variant("base")
OPAQUE_HISTORY = Variant("opaque-history", opaque_history=True)
PROPOSED = Variant("opaque-history-approval", opaque_history=True, opaque_approval=True)
NO_CEL = Variant("no-spec-cel", no_cel=True)
SPEC_RULES_IN_CRD = Variant("spec-rules-in-crd", spec_rules_in_crd=True)
OPAQUE_NO_CEL = Variant("opaque-history-approval-no-cel", True, True, True)
ATOMIC_CHECKPOINT = Variant("atomic-checkpoint", atomic_checkpoint=True)
ATOMIC_STATUS = Variant("atomic-status", atomic_status=True)

# (label, status, CRD variant); grouped by variant so that a round swaps the CRD 5 times.
PLAN: list[tuple[str, str, Variant]] = [
    ("1 minimal", "minimal", BASE),
    ("2 current", "current", BASE),
    ("3 current, no history", "no_history", BASE),
    ("5 current, history bounded to 8", "history_8", BASE),
    ("7a current + approvalRequest", "with_approval", BASE),
    ("0 one opaque string (floor)", "one_string", BASE),
    ("4 history items opaque", "current", OPAQUE_HISTORY),
    ("6 history items opaque, bounded to 8", "history_8", OPAQUE_HISTORY),
    ("7b history opaque + approvalRequest", "with_approval", OPAQUE_HISTORY),
    ("7c history + approvalRequest opaque", "with_approval", PROPOSED),
    ("7d history + approvalRequest opaque, bounded to 8", "with_approval_8", PROPOSED),
    ("8a minimal, spec CEL rules removed", "minimal", NO_CEL),
    ("8b current, spec CEL rules removed", "current", NO_CEL),
    ("8c 7c without spec CEL rules", "with_approval", OPAQUE_NO_CEL),
    ("1b minimal, spec rules in the CRD (before issue 38)", "minimal", SPEC_RULES_IN_CRD),
    ("2b current, spec rules in the CRD (before issue 38)", "current", SPEC_RULES_IN_CRD),
    ("9a minimal, checkpoint atomic", "minimal", ATOMIC_CHECKPOINT),
    ("9b current, checkpoint atomic", "current", ATOMIC_CHECKPOINT),
    ("9c current + approvalRequest, checkpoint atomic", "with_approval", ATOMIC_CHECKPOINT),
    ("9d current, status atomic", "current", ATOMIC_STATUS),
    ("9e current + approvalRequest, status atomic", "with_approval", ATOMIC_STATUS),
    ("10a current, checkpoint one string", "checkpoint_string", BASE),
    ("10b current, checkpoint one string, history bounded to 8", "checkpoint_string_8", BASE),
    ("10c current, checkpoint one string, no history", "checkpoint_string_no_history", BASE),
    ("10d current, no checkpoint, no history", "no_checkpoint_no_history", BASE),
]


# --- measurement -------------------------------------------------------------------------------


def install_variant(env: Env, base: dict[str, Any], variant: Variant, probe_ns: str) -> None:
    """Replace the AgentRun CRD and wait until the API server validates with it: a status write
    carrying the variant's marker survives (an older schema prunes or rejects it)."""
    ext = client.ApiextensionsV1Api(env.kube.api)
    body = variant_crd(base, variant)
    name = body["metadata"]["name"]
    body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(name).metadata.resource_version
    ext.replace_custom_resource_definition(name, body)

    def serving() -> bool:
        run = env.custom.get_namespaced_custom_object(GROUP, VERSION, probe_ns, "agentruns", "probe")
        run["status"] = {"state": "pending", "stateVersion": 1, MARKER: variant.name}
        try:
            run = env.custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, probe_ns, "agentruns", "probe", run
            )
        except ApiException as err:
            if err.status in (409, 422):
                return False
            raise
        return bool(run["status"].get(MARKER) == variant.name)

    eventually(serving, Within.TAKEOVER, f"the {variant.name} CRD to serve", interval=0.1)


def cpu(pid: int) -> float:
    return proc_sample(pid)[1] if pid > 0 else 0.0


def timed_writes(env: Env, status: dict[str, Any], writes: int) -> dict[str, float]:
    """As bench.core.bench_raw_writes (one writer thread per run, PUT status with the last
    resourceVersion), plus CPU seconds per 1000 writes of kube-apiserver, etcd, this client."""
    namespace = env.namespace()
    custom = env.custom
    create_runs(env, namespace, {f"raw{i}": await_steps(STEPS) for i in range(WRITERS)})
    bodies = [
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", f"raw{i}")
        for i in range(WRITERS)
    ]
    per_writer = max(1, writes // WRITERS)
    pids = env.plane.pids

    def hammer(i: int) -> None:
        body = bodies[i]
        for n in range(per_writer):
            body["status"] = {**status, "stateVersion": n + 1}
            body = custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "agentruns", f"raw{i}", body
            )

    apiserver0, etcd0, client0 = (
        cpu(pids.get("kube-apiserver", 0)),
        cpu(pids.get("etcd", 0)),
        time.process_time(),
    )
    started = time.perf_counter()
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(hammer, range(WRITERS)))
    elapsed = time.perf_counter() - started
    total = per_writer * WRITERS
    per_k = 1000 / total
    return {
        "writes_per_second": total / elapsed,
        "apiserver_cpu_s_per_1000": (cpu(pids.get("kube-apiserver", 0)) - apiserver0) * per_k,
        "etcd_cpu_s_per_1000": (cpu(pids.get("etcd", 0)) - etcd0) * per_k,
        "client_cpu_s_per_1000": (time.process_time() - client0) * per_k,
    }


def table(rows: list[dict[str, Any]]) -> str:
    minimal = next(r for r in rows if r["shape"] == "1 minimal")["writes_per_second"]["median"]
    out = [
        f"{'shape':<52} {'bytes':>6} {'writes/s (min-max)':>20} {'ratio':>6} {'apiserver':>10} {'etcd':>6}",
        f"{'':<52} {'':>6} {'':>20} {'':>6} {'cpu s/1k':>10} {'s/1k':>6}",
    ]
    for r in sorted(rows, key=lambda r: r["shape"]):
        w = r["writes_per_second"]
        spread = f"{w['median']:.0f} ({w['min']:.0f}-{w['max']:.0f})"
        out.append(
            f"{r['shape']:<52} {r['bytes']:>6} {spread:>20} {w['median'] / minimal:>6.2f} "
            f"{r['apiserver_cpu_s_per_1000']['median']:>10.2f} {r['etcd_cpu_s_per_1000']['median']:>6.2f}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds; every shape once per round")
    parser.add_argument("--writes", type=int, default=1200, help="status writes per sample (all writers)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/status_shapes.json")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="measure only the shapes whose label starts with this (repeatable; '1 minimal' is always in)",
    )
    args = parser.parse_args(argv)
    wanted = ("1 minimal", *args.only)
    plan = [row for row in PLAN if not args.only or row[0].startswith(wanted)]
    log: Callable[[str], None] = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    base = load_base_crd()
    began = time.perf_counter()
    with environment() as env:
        log("sample statuses from the operator (a finished 8-step run; an approval request)")
        current = bench_transitions(env, 2)["sample_status"]
        statuses = shapes_of(current, approval_request(env))
        statuses["with_approval_8"] = {**statuses["with_approval"], "history": current["history"][-8:]}
        probe_ns = env.namespace()
        create_runs(env, probe_ns, {"probe": await_steps(1)})
        samples: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in plan}
        for round_ in range(args.repeat):
            installed: Variant | None = None
            for label, shape, variant in plan:
                if variant != installed:
                    install_variant(env, base, variant, probe_ns)
                    installed = variant
                samples[label].append(timed_writes(env, statuses[shape], args.writes))
                log(f"round {round_ + 1}: {label}: {samples[label][-1]['writes_per_second']:.0f} writes/s")
    rows = []
    for label, shape, variant in plan:
        metrics = samples[label]
        row: dict[str, Any] = {
            "shape": label,
            "status": shape,
            "crd": variant.name,
            "bytes": size(statuses[shape]),
        }
        for key in metrics[0]:
            row[key] = summary([m[key] for m in metrics])
        row["history_entries"] = len(statuses[shape].get("history", []))
        rows.append(row)
    minimal = rows[0]["writes_per_second"]["median"]
    for row in rows:
        row["ratio_to_minimal"] = row["writes_per_second"]["median"] / minimal
    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "operator_version": __version__,
        "etcd_fsync": True,
        "writers": WRITERS,
        "writes_per_sample": args.writes // WRITERS * WRITERS,
        "repeat": args.repeat,
        "seconds": round(time.perf_counter() - began),
        "shapes": rows,
        "statuses": statuses,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {args.out} in {results['seconds']}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
