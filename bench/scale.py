"""``make bench-scale``: one replica over many waiting runs, and what a finished run leaves in etcd
once retention has done its work (issue 38, item 4).

Parked (``--parked``, default 100,000): the runs are created (stamped as the webhook stamps them)
and taken to their wait for input by one operator; once retention's finalizer is on each, that
operator stops and a fresh one starts cold on them, the webhook on, as the chart installs it:

- the cold start: seconds from the process's start to ready (every run's expiry armed, the
  ``durable_agents_scheduled_wakeups`` gauge), beside the raw list (the same pages of 200 read by
  a client that only reads the bytes: the API server's part, the floor of a list);
- the operator's memory through the cold start and an idle window of ``--window`` seconds (its
  process tree's PSS, as a container's accounting sees it; the RSS sum beside it);
- writes per minute in that window, from the API server's audit log, by resource: the runs' own
  (runs, their status, ActionRecords, Events) apart from the Leases';
- kube-apiserver's and etcd's RSS, and the bytes etcd holds per parked run (its keyspace).

Finished (``--finished``, default 10,000, created at ``--finished-per-hour``, default 10,000): runs
of 8 steps that complete at once, under a policy that deletes a run ``--ttl`` after it finishes and
keeps its AgentRunRecord. Once every run is gone and every record written: the bytes etcd holds per
finished run (the records, and anything else of the group left behind), and how many finished runs
etcd's default 2 GB quota and the recommended 8 GB then hold.

    .venv/bin/python -m bench.scale --parked 100000 --finished 10000 --out bench/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.core import OPERATOR_USER, REPO, Env, await_steps, create_runs, environment, log, parked
from bench.peers import procstat
from bench.resources import ASK
from durable_agents import __version__
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.retention import FINALIZER
from durable_agents_testkit.audit import read_audit
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, metric, scrape

PAGE = 500  # what the bench reads per request: metadata only, so a page stays small
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
QUOTAS = {"default_2GB": 2 * 10**9, "recommended_8GB": 8 * 10**9}
ETCD_QUOTA = 2 * 2**30  # etcd's --quota-backend-bytes default, which the local control plane keeps
RUN_RESOURCES = ("agentruns", "actionrecords", "agentrunrecords", "events")


def pages(env: Env, namespace: str, plural: str, accept: str, limit: int = PAGE) -> list[bytes]:
    """Every page of a list of ``plural`` in ``namespace``, as the API server sent it."""
    api = env.kube.api
    out: list[bytes] = []
    token: str | None = None
    while True:
        query: list[tuple[str, Any]] = [("limit", limit)] + ([("continue", token)] if token else [])
        method, url, headers, _, _ = api.param_serialize(
            "GET",
            f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{plural}",
            path_params={"namespace": namespace},
            query_params=query,
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(method, url, header_params=headers)
        response.read()
        out.append(response.data)
        token = json.loads(response.data)["metadata"].get("continue")
        if not token:
            return out


def metadata(env: Env, namespace: str, plural: str) -> list[dict[str, Any]]:
    """The objects' metadata alone (a list of 100,000 whole runs is 600 MB to read each time)."""
    return [
        item
        for page in pages(env, namespace, plural, METADATA_LIST)
        for item in json.loads(page)["items"] or []
    ]


def process_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def etcd_bytes(env: Env, prefix: str) -> dict[str, int]:
    """Keys and stored bytes (key and value) under ``prefix``, read from etcd itself."""
    keys = size = 0
    for page in env.plane.etcd_pages(prefix, 1000):
        keys += len(page)
        size += sum(len(k) + len(v) for k, v in page)
    return {"keys": keys, "bytes": size}


def writes_by_resource(env: Env, since: datetime, until: datetime) -> dict[str, int]:
    entries = read_audit(env.plane.audit_log_path, user=OPERATOR_USER, since=since, until=until)
    return dict(Counter(e.what for e in entries if e.is_write))


def head_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def memory_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


class MemoryWatch:
    """The control plane's peak RSS while runs are parked, and a floor under the machine's
    available memory: below it the bench stops with a clear error instead of the kernel's OOM
    killer picking a process (kube-apiserver and etcd hold every parked run)."""

    def __init__(self, env: Env, floor_mib: float) -> None:
        self.env, self.floor_mib = env, floor_mib
        self.peak: dict[str, float] = {"kube-apiserver": 0.0, "etcd": 0.0}
        self.least_available_mib = float("inf")
        self.peak_db_bytes = 0

    def check(self) -> None:
        for name in self.peak:
            self.peak[name] = max(self.peak[name], process_rss_mib(self.env.plane.pids[name]))
        self.peak_db_bytes = max(self.peak_db_bytes, self.env.plane.etcd_status()["dbSize"])
        if self.peak_db_bytes > 0.95 * ETCD_QUOTA:
            raise MemoryError(
                f"etcd's database is {self.peak_db_bytes / 2**20:.0f} MiB, near its quota of "
                f"{ETCD_QUOTA / 2**20:.0f} MiB: past it etcd refuses every write"
            )
        available = memory_available_mib()
        self.least_available_mib = min(self.least_available_mib, available)
        if available < self.floor_mib:
            raise MemoryError(
                f"the machine has {available:.0f} MiB available, under the bench's floor of "
                f"{self.floor_mib:.0f} MiB (kube-apiserver {self.peak['kube-apiserver']:.0f} MiB, "
                f"etcd {self.peak['etcd']:.0f} MiB): fewer parked runs fit this machine"
            )

    def summary(self) -> dict[str, float]:
        return {
            "kube_apiserver_peak_rss_mib": self.peak["kube-apiserver"],
            "etcd_peak_rss_mib": self.peak["etcd"],
            "least_available_mib": round(self.least_available_mib),
            "etcd_peak_db_mib": round(self.peak_db_bytes / 2**20),
        }


def ownership_account(logged: str, metrics_text: str) -> dict[str, float]:
    """What the operator that parked the runs says of its ownership meanwhile (pure): the region
    and shard changes it counted (taking the region and every shard at its start are changes), the
    shard holds it lost, the lapses it logged, the Events of commits it dropped, and the pauses of
    its garbage collector (the full collections, those of a second or more, the longest logged) and
    its event loop's stalls of 2 s or more; and what the parking cost it: its CPU seconds from its
    start, and the watch events of its own writes it did not decide again."""
    changes = "durable_agents_ownership_changes_total"
    pause = "durable_agents_gc_pause_seconds"
    long_pauses = sum(
        metric(metrics_text, f'{pause}_count{{generation="{g}"}}', 0.0)
        - metric(metrics_text, f'{pause}_bucket{{generation="{g}",le="1.0"}}', 0.0)
        for g in "012"
    )
    logged_pauses = [float(s) for s in re.findall(r"held this process for ([\d.]+) s", logged)]
    shard_changes = "durable_agents_shard_ownership_changes_total"
    return {
        "region_changes": metric(metrics_text, changes + '{kind="region"}', 0.0),
        "shard_changes": metric(metrics_text, changes + '{kind="shard"}', 0.0),
        "shards_lost": metric(metrics_text, shard_changes + '{reason="lost"}', 0.0),
        "lapses_logged": logged.count("not renewed in time") + logged.count("liveness lapsed"),
        "events_dropped": metric(metrics_text, "durable_agents_events_dropped_total", 0.0),
        "full_collections": metric(metrics_text, f'{pause}_count{{generation="2"}}', 0.0),
        "gc_pauses_over_1s": long_pauses,
        "longest_gc_pause_logged": max(logged_pauses, default=0.0),
        "loop_stalls": metric(metrics_text, "durable_agents_event_loop_stall_seconds_count", 0.0),
        "cpu_seconds": metric(metrics_text, "process_cpu_seconds_total", 0.0),
        "own_writes_skipped": metric(
            metrics_text, 'durable_agents_own_writes_skipped_total{queue="run-worker"}', 0.0
        ),
    }


def measure_parked(
    env: Env, count: int, window: float, finalizer_at_create: bool = False, floor_mib: float = 1024
) -> dict[str, Any]:
    namespace = env.namespace()
    policy(env, namespace, ttl=None)
    watch = MemoryWatch(env, floor_mib)
    started = time.perf_counter()
    # With the finalizer the operator would add once each run is parked already on it, the
    # operator writes nothing to park a run but its status: what the cold start and the idle
    # window then find is the same, without 100,000 paced finalizer writes (about 22 minutes).
    create_runs(
        env,
        namespace,
        {f"w{i:06d}": ASK for i in range(count)},
        finalizers=(FINALIZER,) if finalizer_at_create else (),
    )
    created = time.perf_counter() - started
    log(f"parked: {count} runs created in {created:.0f} s; parking")
    port = free_port()
    op = env.operator(
        namespace,
        "parking",
        DURABLE_AGENTS_METRICS_PORT=str(port),
        DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()),
    )
    started = time.perf_counter()
    try:

        def all_parked() -> bool:
            watch.check()
            return parked(port) >= count

        eventually(all_parked, 6 * 3600, f"{count} runs parked", interval=5)
        parking = time.perf_counter() - started
        log(f"parked in {parking:.0f} s; waiting for retention's finalizer on each")

        def finalized() -> bool:
            return (
                sum(
                    FINALIZER in (m["metadata"].get("finalizers") or [])
                    for m in metadata(env, namespace, "agentruns")
                )
                >= count
            )

        eventually(finalized, 6 * 3600, f"{count} runs with {FINALIZER}", interval=15)
        finalizing = time.perf_counter() - started
        ownership = ownership_account(op.log_path.read_text(errors="replace"), scrape(port))
        log(f"ownership while parking: {json.dumps(ownership)}")
    finally:
        op.stop()
    began = time.perf_counter()
    raw = pages(env, namespace, "agentruns", "application/json", limit=200)
    raw_list = time.perf_counter() - began
    log(f"finalized in {finalizing:.0f} s; raw list {raw_list:.1f} s, {sum(map(len, raw)) / 2**20:.0f} MiB")
    del raw
    port = free_port()
    started = time.perf_counter()
    op = env.operator(
        namespace, "cold", DURABLE_AGENTS_METRICS_PORT=str(port), DURABLE_AGENTS_WEBHOOK_PORT=str(free_port())
    )
    try:
        # Only the operator's metrics are read while its cold start is timed (the guard's etcd
        # status and /proc reads were for the long parking, with the machine's memory filling).
        with procstat.RssSampler(op.pid, interval=0.5) as cold:
            eventually(lambda: parked(port) >= count, 3600, f"{count} wake-ups armed", interval=0.5)
        cold_seconds = time.perf_counter() - started
        log(f"cold start {cold_seconds:.1f} s; idle for {window:.0f} s")
        since = datetime.now(UTC)
        with procstat.RssSampler(op.pid, interval=1.0) as idle:
            time.sleep(window)  # the idle window is what is measured
        until = datetime.now(UTC)
        time.sleep(2)  # the audit log is written after the response: the window's last entries land
        writes = writes_by_resource(env, since, until)
    finally:
        op.stop()
    per_minute = {what: round(n * 60 / window, 1) for what, n in sorted(writes.items())}
    runs_writes = sum(v for k, v in per_minute.items() if k.split("/")[0] in RUN_RESOURCES)
    # The control plane's memory before the keyspace is read (a read of every run grows etcd's).
    apiserver_rss = process_rss_mib(env.plane.pids["kube-apiserver"])
    etcd_rss = process_rss_mib(env.plane.pids["etcd"])
    db = env.plane.etcd_status()
    kept = etcd_bytes(env, f"/registry/{GROUP}/agentruns/{namespace}/")
    return {
        "runs": count,
        "seconds_to_create": round(created, 1),
        "seconds_to_park_all": round(parking, 1),
        "seconds_to_finalize_all": round(finalizing, 1),
        "raw_list_seconds": round(raw_list, 1),
        "cold_start_seconds": round(cold_seconds, 1),
        "cold_start_memory": cold.summary(),
        "idle_memory": idle.summary(),
        "idle_window_seconds": window,
        "idle_writes_per_minute": per_minute,
        "idle_run_writes_per_minute": runs_writes,
        "kube_apiserver_rss_mib": apiserver_rss,
        "etcd_rss_mib": etcd_rss,
        "etcd_db_mib": {k: round(v / 2**20) for k, v in db.items()},
        "etcd_bytes_per_parked_run": round(kept["bytes"] / count),
        "finalizer_at_create": finalizer_at_create,
        "ownership_while_parking": ownership,
        "control_plane_while_parked": watch.summary(),
    }


def policy(env: Env, namespace: str, ttl: str | None) -> None:
    spec: dict[str, Any] = {"version": "1", "default": True, "approvalRequiredTiers": []}
    if ttl is not None:
        spec["retention"] = {"ttlAfterFinished": ttl, "keepRecord": True}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentPolicy",
        "metadata": {"name": "bench"},
        "spec": spec,
    }
    client.CustomObjectsApi(env.kube.api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentpolicies", body
    )


def measure_finished(env: Env, count: int, per_hour: float, ttl: str) -> dict[str, Any]:
    namespace = env.namespace()
    policy(env, namespace, ttl=ttl)
    op = env.operator(namespace, "retention", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    started = time.perf_counter()
    try:
        Runs(env.kube, namespace).await_webhook()  # the API server calls this operator's, not the last one's
        spec = await_steps(8)
        create_runs(env, namespace, {f"f{i:06d}": spec for i in range(count)}, per_second=per_hour / 3600)
        log(f"finished: {count} runs created in {time.perf_counter() - started:.0f} s; awaiting retention")

        def retained() -> bool:
            return (
                not metadata(env, namespace, "agentruns")
                and len(metadata(env, namespace, "agentrunrecords")) >= count
            )

        eventually(retained, 6 * 3600, f"{count} runs deleted by retention, their records kept", interval=10)
        seconds = time.perf_counter() - started
    finally:
        op.stop()
    group = etcd_bytes(env, f"/registry/{GROUP}/")
    records = etcd_bytes(env, f"/registry/{GROUP}/agentrunrecords/{namespace}/")
    actions = etcd_bytes(env, f"/registry/{GROUP}/actionrecords/{namespace}/")
    events = etcd_bytes(env, f"/registry/events/{namespace}/")
    per_run = (records["bytes"] + actions["bytes"]) / count
    return {
        "runs": count,
        "created_per_hour": per_hour,
        "ttl_after_finished": ttl,
        "seconds_until_retained": round(seconds, 1),
        "etcd_records": records,
        "etcd_action_records_left": actions,
        "etcd_events_until_their_ttl": events,
        "etcd_group_bytes_all_namespaces": group["bytes"],
        "etcd_bytes_per_finished_run": round(per_run),
        "finished_runs_held": {quota: int(size // per_run) for quota, size in QUOTAS.items()}
        if per_run
        else {},
    }


def merged(result: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """``result`` with each part it did not measure (parked, finished) taken from ``earlier``,
    marked with the date and commit it was measured at (pure)."""
    out = dict(result)
    for part in ("parked", "finished"):
        if part not in out and part in earlier:
            measured_in = {k: earlier[k] for k in ("date", "commit") if k in earlier}
            out[part] = {**earlier[part], "measured_in": earlier[part].get("measured_in", measured_in)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parked", type=int, default=100_000, help="runs parked in a wait for input")
    parser.add_argument("--window", type=float, default=120.0, help="idle window, seconds")
    parser.add_argument(
        "--finished", type=int, default=10_000, help="runs finished under retention (0: none)"
    )
    parser.add_argument("--finished-per-hour", type=float, default=10_000.0, help="their creation rate")
    parser.add_argument("--ttl", default="1m", help="the policy's retention.ttlAfterFinished")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/scale.json")
    parser.add_argument(
        "--finalizer-at-create",
        action="store_true",
        help="create the parked runs with retention's finalizer on (skips its paced writes)",
    )
    parser.add_argument(
        "--memory-floor-mib", type=float, default=1024, help="stop when the machine has less available"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the part not measured now (parked or finished) from --out, with its own date and commit",
    )
    args = parser.parse_args(argv)
    earlier: dict[str, Any] = json.loads(args.out.read_text()) if args.merge and args.out.exists() else {}
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "operator_version": __version__,
        "commit": head_commit(),
        "targets": {
            "operator_rss_mib_under": 1024,
            "cold_start_seconds_under": 120,
            "idle_run_writes_per_minute": 0,
            "etcd_bytes_per_finished_run_at_most": 8192,
        },
    }
    began = time.monotonic()
    with environment() as env:
        if args.parked:
            result["parked"] = measure_parked(
                env, args.parked, args.window, args.finalizer_at_create, args.memory_floor_mib
            )
            log(f"parked: {json.dumps(result['parked'])}")
        if args.finished:
            result["finished"] = measure_finished(env, args.finished, args.finished_per_hour, args.ttl)
            log(f"finished: {json.dumps(result['finished'])}")
    result = merged(result, earlier)
    result["seconds"] = round(time.monotonic() - began)
    result["took"] = str(timedelta(seconds=result["seconds"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
