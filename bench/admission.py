"""``make bench-admission``: how long a request that passes the operator's admission webhook takes
while the same operator process works a run of the largest admitted size (issue 30).

One local control plane (etcd fsync ON, as ``bench.core``), one operator process with its webhook
on (failurePolicy Fail, as installed by the operator). Small runs wait on an event; each sample is
one cancellation (a merge patch adding ``spec.cancellations``: the mutating webhook stamps it, the
validating webhook asks a SubjectAccessReview) on a small run, timed at the client from request
to answer. First the baseline, with nothing else to do, and every ``--big-every`` samples a
cancellation of a run of the largest admitted size that is held, not worked (the same review
size); then the same while runs of the largest admitted size (``durable_agents_testkit.large_runs``:
448 KiB as stored, five 64 KiB effects and awaits that commit at once) are worked one after the
other, every ``--big-every`` samples the busy run itself cancelled (the next one is created at
once). For each large-run cancellation the API server's own count of time spent calling the two
webhooks is kept beside it (``webhook_seconds_of_each``), so the webhook's share shows apart from
the API server's and etcd's; where the webhook is a process of its own that exports its review
time (``durable_agents_admission_review_seconds``), that process's own time on the two reviews is
kept too (``webhook_process_seconds_of_each``): the rest of the API server's figure is waiting for
it to be scheduled, TLS, and the API server's own work.

With ``--base REV`` the operator of that revision (``git archive``, imported through
``PYTHONPATH`` as ``bench.ab`` does) is measured too, in rounds interleaved with the working
tree's, so the noise of a shared machine falls on both alike.

    .venv/bin/python -m bench.admission --base REV --rounds 3 --out bench/results/admission.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.core import REPO, Env, await_states, create_runs, environment, log, percentile, proc_sample
from durable_agents import __version__
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.governance import permissive_default
from durable_agents_testkit.large_runs import largest_run, size_of
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.releases import materialize_release
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port, scrape

TERMINAL = ("completed", "canceled", "failed", "quarantined")
REVIEW_METRIC = "durable_agents_admission_review_seconds"
CANCEL = {"spec": {"cancellations": {"stop": {"scope": "task"}}}}


@dataclass
class Sample:
    seconds: float
    error: str | None = None
    webhook_seconds: float | None = None  # of it, the API server's calls to the two webhooks
    process_seconds: float | None = None  # of those, the webhook process's own (where it says)


def cancel(custom: client.CustomObjectsApi, namespace: str, name: str) -> Sample:
    """One cancellation through the webhook, timed; a refusal is kept with its message."""
    started = time.perf_counter()
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", name, CANCEL)
    except client.ApiException as err:
        return Sample(time.perf_counter() - started, f"HTTP {err.status}: {str(err.body)[:300]}")
    return Sample(time.perf_counter() - started)


def figures(samples: list[Sample]) -> dict[str, Any]:
    seconds = [s.seconds for s in samples]
    errors = [s.error for s in samples if s.error is not None]
    return {
        "n": len(samples),
        "p50_seconds": percentile(seconds, 0.5),
        "p99_seconds": percentile(seconds, 0.99),
        "max_seconds": max(seconds),
        "errors": len(errors),
        "timeouts": sum("context deadline exceeded" in e or "timeout" in e.lower() for e in errors),
        "first_errors": errors[:3],
        "samples": [round(s, 4) for s in seconds],
        **(
            {"webhook_seconds_of_each": [round(s.webhook_seconds, 4) for s in samples if s.webhook_seconds]}
            if any(s.webhook_seconds for s in samples)
            else {}
        ),
        **(
            {
                "webhook_process_seconds_of_each": [
                    round(s.process_seconds, 4) for s in samples if s.process_seconds is not None
                ]
            }
            if any(s.process_seconds is not None for s in samples)
            else {}
        ),
    }


@dataclass
class BusyRuns:
    """Keeps one run of the largest admitted size being worked: each one, once it ends, is
    followed by the next (created through the webhook, as a user writes it)."""

    env: Env
    namespace: str
    url: str
    awaits: int
    current: str | None = None
    ended: list[dict[str, Any]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    count: int = 0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._keep, name="busy-runs", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=Within.TAKEOVER)

    def _state(self, name: str) -> tuple[str, int]:
        run = self.env.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "agentruns", name)
        status = run.get("status") or {}
        return str(status.get("state", "pending")), int(status.get("stateVersion") or 0)

    def _keep(self) -> None:
        runs = Runs(self.env.kube, self.namespace)
        while not self.stopping.is_set():
            name = f"big-{self.count}"
            spec = largest_run(self.url, name, self.awaits)
            started = time.perf_counter()
            runs.create(spec, name=name, stamped=False)
            self.count += 1
            self.current = name
            state, version = "pending", 0
            while not self.stopping.is_set():
                state, version = self._state(name)
                if state in TERMINAL:
                    break
                time.sleep(0.5)
            self.current = None
            self.ended.append(
                {
                    "name": name,
                    "bytes_as_stored": size_of(name, spec),
                    "state": state,
                    "state_version": version,
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )

    def wait_worked(self) -> str:
        """The current busy run's name, once the operator has committed at least one transition."""

        def worked() -> str | None:
            name = self.current
            return name if name is not None and self._state(name)[1] >= 1 else None

        found: str = eventually(worked, Within.TAKEOVER, "a run of the largest size being worked")
        return found


def small_spec() -> dict[str, Any]:
    return {
        "taskType": "small",
        "objective": "wait to be cancelled",
        "steps": [{"name": "wait", "await": {"event": "never"}}, {"name": "done", "complete": {}}],
    }


def webhook_timeout(env: Env, namespace: str) -> int | None:
    """timeoutSeconds of the operator's mutating webhook for AgentRuns (as it installed it)."""
    api = client.AdmissionregistrationV1Api(env.kube.api)
    for config in api.list_mutating_webhook_configuration().items:
        if config.metadata.name.endswith(namespace):
            return int(config.webhooks[0].timeout_seconds)
    return None


WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def webhook_seconds(env: Env) -> dict[str, tuple[float, float]]:
    """The API server's own count of time spent calling each webhook: name -> (seconds, calls)."""
    api = env.kube.api
    method, url, headers, _, _ = api.param_serialize(
        method="GET", resource_path="/metrics", header_params={}, auth_settings=["BearerToken"]
    )
    response = api.rest_client.request(method, url, headers=headers)
    out: dict[str, tuple[float, float]] = {}
    for line in response.read().decode().splitlines():
        for suffix, at in (("_sum{", 0), ("_count{", 1)):
            if line.startswith(WEBHOOK_METRIC + suffix):
                name = line.split('name="', 1)[1].split('"', 1)[0]
                kind = line.split('type="', 1)[1].split('"', 1)[0]
                pair = list(out.get(f"{kind} {name}", (0.0, 0.0)))
                pair[at] += float(line.rsplit(" ", 1)[1])
                out[f"{kind} {name}"] = (pair[0], pair[1])
    return out


def webhook_mean(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> Any:
    """Mean seconds per call of each webhook between two scrapes (the API server's view)."""
    out = {}
    for key, (seconds, calls) in after.items():
        s0, c0 = before.get(key, (0.0, 0.0))
        if calls > c0:
            out[key] = {"calls": int(calls - c0), "mean_seconds": round((seconds - s0) / (calls - c0), 4)}
    return out


def held_runs(env: Env, namespace: str, url: str, count: int, awaits: int) -> list[str]:
    """Runs of the largest size, worked until they wait for an event nobody gives: the baseline
    for cancelling a large run (the same review size, nothing being worked)."""
    runs = Runs(env.kube, namespace)
    names = [f"held-{k}" for k in range(count)]
    for name in names:
        runs.create(largest_run(url, name, awaits, hold=True), name=name, stamped=False)

    def holding() -> bool:
        statuses = [runs.get(name).get("status") or {} for name in names]
        return all(s.get("waitingFor") == "event:hold" for s in statuses)

    # Setup, not measured: on a loaded machine ten 448 KiB runs take longer than a takeover.
    eventually(holding, 5 * Within.TAKEOVER, f"{count} runs of the largest size waiting at their last step")
    return names


def review_seconds(port: int) -> float | None:
    """The webhook process's own seconds on AgentRun reviews so far (None: not exported)."""
    try:
        text = scrape(port)
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(REVIEW_METRIC + "_sum{") and 'resource="agentruns"' in line:
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def measure(
    env: Env,
    namespace: str,
    names: list[str],
    gap: float,
    busy: BusyRuns | list[str],
    every: int,
    metrics_port: int,
) -> Any:
    """Cancel each of ``names``; every ``every``, a large run too: the busy one, or the next held one."""
    custom = env.custom
    small: list[Sample] = []
    big: list[Sample] = []
    held = list(busy) if isinstance(busy, list) else []
    for i, name in enumerate(names):
        small.append(cancel(custom, namespace, name))
        if every and (i + 1) % every == 0 and (held or isinstance(busy, BusyRuns)):
            target = held.pop(0) if held else busy.wait_worked()  # type: ignore[union-attr]
            before = webhook_seconds(env)  # nothing else passes the webhook meanwhile (but rarely)
            own = review_seconds(metrics_port)
            sample = cancel(custom, namespace, target)
            after = webhook_seconds(env)
            sample.webhook_seconds = sum(t - before.get(k, (0.0, 0.0))[0] for k, (t, _) in after.items())
            own_after = review_seconds(metrics_port)
            if own is not None and own_after is not None:
                sample.process_seconds = own_after - own
            big.append(sample)
        time.sleep(gap)
    return small, big


def profile(pid: int, out: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy recording the operator (all threads) while the busy phase lasts, if asked."""
    if out is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--pid", str(pid), "--output", str(out), "--threads", "--rate", "50"]
    return subprocess.Popen([*command, "--format", "speedscope" if out.suffix == ".json" else "flamegraph"])


@dataclass
class Round:
    """One operator process, both phases."""

    baseline: list[Sample]
    busy: list[Sample]
    busy_run: list[Sample]
    held_run: list[Sample]
    cpu_percent: dict[str, float]
    webhook_mean: dict[str, Any]
    busy_runs: list[dict[str, Any]]
    webhook_timeout_seconds: int | None


def one_round(args: argparse.Namespace, env: Env, refsystem: ReferenceSystemThread, label: str) -> Round:
    namespace = env.namespace()
    # Governed as the tests' namespaces are (issue 32): the large runs' effects need a policy.
    permissive_default(env.kube.api, namespace)
    port, metrics = str(free_port()), free_port()
    op: OperatorProcess = env.operator(
        namespace,
        f"admission-{label}",
        DURABLE_AGENTS_WEBHOOK_PORT=port,
        DURABLE_AGENTS_METRICS_PORT=str(metrics),
    )
    cpu: dict[str, float] = {}
    hooks: dict[str, Any] = {}
    try:
        eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
        Runs(env.kube, namespace).await_webhook()
        names = [f"small-{i}" for i in range(2 * args.samples)]
        create_runs(env, namespace, {name: small_spec() for name in names})
        await_states(env, namespace, "waiting_external", len(names), timeout=Within.TAKEOVER)
        held = held_runs(env, namespace, refsystem.url, args.samples // args.big_every, args.awaits)
        log(f"{label} baseline: {args.samples} cancellations of small runs, the operator otherwise idle")
        _, cpu0 = proc_sample(op.pid)
        started, hooks0 = time.perf_counter(), webhook_seconds(env)
        baseline, idle_big = measure(
            env, namespace, names[: args.samples], args.gap, held, args.big_every, metrics
        )
        cpu["baseline"] = round(100 * (proc_sample(op.pid)[1] - cpu0) / (time.perf_counter() - started), 1)
        hooks["baseline"] = webhook_mean(hooks0, webhook_seconds(env))
        log(f"{label} busy: the same beside runs of the largest size, one cancelled every {args.big_every}")
        busy = BusyRuns(env, namespace, refsystem.url, args.awaits)
        busy.start()
        busy.wait_worked()
        _, cpu0 = proc_sample(op.pid)
        started, hooks0 = time.perf_counter(), webhook_seconds(env)
        profiler = profile(
            op.pid, args.profile.with_stem(f"{args.profile.stem}-{label}") if args.profile else None
        )
        loaded, big = measure(env, namespace, names[args.samples :], args.gap, busy, args.big_every, metrics)
        cpu["busy"] = round(100 * (proc_sample(op.pid)[1] - cpu0) / (time.perf_counter() - started), 1)
        hooks["busy"] = webhook_mean(hooks0, webhook_seconds(env))
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            profiler.wait(timeout=60)
        busy.stop()
        timeout = webhook_timeout(env, namespace)
    finally:
        op.stop()
    return Round(baseline, loaded, big, idle_big, cpu, hooks, busy.ended, timeout)


def side_figures(rounds: list[Round]) -> dict[str, Any]:
    """Every round of one operator build together, each phase's samples pooled."""
    out: dict[str, Any] = {
        "baseline": figures([s for r in rounds for s in r.baseline]),
        "busy": figures([s for r in rounds for s in r.busy]),
        "busy_run_cancellations": figures([s for r in rounds for s in r.busy_run]),
        "held_run_cancellations": figures([s for r in rounds for s in r.held_run]),
        "operator_cpu_percent": [r.cpu_percent for r in rounds],
        "webhook_mean_seconds_api_server": [r.webhook_mean for r in rounds],
        "busy_runs": [run for r in rounds for run in r.busy_runs],
    }
    for phase in ("baseline", "busy", "held_run_cancellations", "busy_run_cancellations"):
        f = out[phase]
        log(
            f"  {phase}: p50 {f['p50_seconds'] * 1000:.0f} ms, p99 {f['p99_seconds'] * 1000:.0f} ms, "
            f"max {f['max_seconds'] * 1000:.0f} ms, {f['errors']} errors ({f['n']} samples)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100, help="cancellations per phase and round")
    parser.add_argument("--rounds", type=int, default=2, help="operator processes per build, interleaved")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--big-every", type=int, default=10, help="cancel the busy run every N samples")
    parser.add_argument("--awaits", type=int, default=40, help="await steps of each busy run")
    parser.add_argument("--base", help="git revision measured beside the working tree (interleaved rounds)")
    parser.add_argument("--profile", type=Path, help="py-spy the operator in the busy phase (.svg or .json)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/admission.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "operator_version": __version__,
        "etcd_fsync": True,
        "samples_per_phase_and_round": args.samples,
        "rounds": args.rounds,
        "gap_seconds": args.gap,
        "base": args.base,
    }
    with tempfile.TemporaryDirectory(prefix="admission-") as tmp, environment() as env:
        sides = {"change": env}
        if args.base:
            base = materialize_release(REPO, args.base, Path(tmp))
            sides = {"base": replace(env, operator_env=base.env()), "change": env}
        rounds: dict[str, list[Round]] = {side: [] for side in sides}
        with ReferenceSystemThread() as refsystem:
            for i in range(args.rounds):
                for side, side_env in sides.items():
                    rounds[side].append(one_round(args, side_env, refsystem, f"{side}-{i}"))
        results["webhook_timeout_seconds"] = rounds["change"][0].webhook_timeout_seconds
        for side, done in rounds.items():
            log(f"{side}:")
            results[side] = side_figures(done)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
