"""kube-apiserver's own CPU profile (Go pprof) during a repetition, broken down by what it did.

The peer workload's API server CPU per run is read from /proc; this says what it is made of. The
API server serves ``/debug/pprof/profile?seconds=N`` (``--profiling``, on by default) to an admin:
profiles of a few seconds are taken back to back while the repetition runs, merged with
``go tool pprof``, and each sample (a stack) is charged to one request kind (the handler it runs
under, or the background loop) and, apart, to one kind of work (JSON, CEL, schema validation, TLS,
the garbage collector...). Written beside the operator's flame graph (``make profile``):
``<row>.apiserver.pb.gz`` (open it with ``go tool pprof -http``), ``<row>.apiserver.txt`` (top
functions) and the two breakdowns in the row's ``profiled`` record.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from kubernetes import config

CHUNK_SECONDS = 5

# (label, substrings of a frame), by priority: the first label a frame of the stack matches.
ENTRIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("status update (PUT .../status)", ("serveStatus.UpdateResource", "serveStatus.PatchResource")),
    ("patch", ("(*patcher).patchResource", "handlers.PatchResource")),
    ("update", ("UpdateResource",)),
    ("create", ("createHandler", "CreateResource", "CreateNamedResource")),
    ("delete", ("DeleteResource", "DeleteCollection")),
    ("get", ("GetResource",)),
    ("list", ("ListResource",)),
    ("watch: encode and send events", ("serveWatch", "(*WatchServer)")),
    ("watch cache: decode etcd's events", ("etcd3.(*watchChan)",)),
    (
        "watch cache: fan-out to watchers",
        ("(*Cacher).dispatchEvent", "(*cacheWatcher)", "(*Cacher).processEvent"),
    ),
    ("admission webhook calls", ("admission/plugin/webhook",)),
    ("audit backend", ("apiserver/pkg/audit", "plugin/pkg/audit")),
    ("garbage collector", ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge")),
    (
        "request filters (authentication, authorization, priority and fairness, tracing)",
        ("timeoutHandler", "priorityAndFairness", "otelhttp", "endpoints/filters", "server/filters"),
    ),
    ("TLS and HTTP serving", ("crypto/tls", "net/http.(*conn)", "golang.org/x/net/http2")),
)

# The same for the kind of work.
WORK: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "garbage collector",
        ("runtime.gcBgMarkWorker", "runtime.gcAssist", "runtime.bgsweep", "runtime.bgscavenge"),
    ),
    ("admission webhooks (calls and reviews)", ("admission/plugin/webhook",)),
    ("validating admission policy", ("admission/plugin/policy",)),
    ("CEL (the CRD's rules)", ("cel-go", "pkg/cel", "apiserver/schema/cel")),
    (
        "OpenAPI schema validation",
        ("kube-openapi/pkg/validation", "apiextensions-apiserver/pkg/apiserver/validation"),
    ),
    ("structural schema (prune, default)", ("schema/pruning", "schema/defaulting", "schema/objectmeta")),
    ("managed fields", ("managedfields", "structured-merge-diff")),
    ("JSON merge patch", ("json-patch", "jsonpatch")),
    ("audit", ("apiserver/pkg/audit", "plugin/pkg/audit")),
    (
        "JSON encode/decode",
        ("encoding/json", "sigs.k8s.io/json", "serializer/json", "json-iterator", "unstructured"),
    ),
    ("etcd client (gRPC, protobuf)", ("go.etcd.io/etcd", "google.golang.org/grpc", "protobuf")),
    ("TLS and crypto", ("crypto/",)),
    ("network syscalls", ("syscall.", "internal/poll")),
    (
        "memory allocation",
        ("runtime.mallocgc", "runtime.newobject", "runtime.makeslice", "runtime.growslice"),
    ),
)


def _fetch(kubeconfig: Path, seconds: int) -> bytes:
    api = config.new_client_from_config(str(kubeconfig))
    try:
        url = f"{api.configuration.host}/debug/pprof/profile?seconds={seconds}"
        response = api.call_api("GET", url, _request_timeout=seconds + 30)
        response.read()
        return bytes(response.data)
    finally:
        api.close()


class ApiServerProfile:
    """Back-to-back CPU profiles of kube-apiserver from ``start`` to ``stop`` (the last one ends
    up to CHUNK_SECONDS after ``stop``), merged into ``<out>.pb.gz``."""

    def __init__(self, kubeconfig: Path, out: Path) -> None:
        self.kubeconfig = kubeconfig
        self.out = out
        self._stopping = threading.Event()
        self._chunks: list[Path] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="apiserver-pprof", daemon=True)

    def start(self) -> ApiServerProfile:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            while not self._stopping.is_set():
                chunk = self.out.with_name(f"{self.out.name}.{len(self._chunks)}.pb.gz")
                chunk.write_bytes(_fetch(self.kubeconfig, CHUNK_SECONDS))
                self._chunks.append(chunk)
        except BaseException as error:  # reported by stop(): a missing profile must not pass silently
            self._error = error

    def stop(self) -> dict[str, Any]:
        self._stopping.set()
        self._thread.join(timeout=CHUNK_SECONDS + 60)
        if self._error is not None:
            raise RuntimeError(f"kube-apiserver's profile failed: {self._error}") from self._error
        go = shutil.which("go") or "/usr/local/go/bin/go"
        merged = self.out.with_name(f"{self.out.name}.pb.gz")
        subprocess.run(
            [go, "tool", "pprof", "-proto", "-output", str(merged), *map(str, self._chunks)],
            check=True,
            capture_output=True,
        )
        for chunk in self._chunks:
            chunk.unlink()
        top = subprocess.run(
            [go, "tool", "pprof", "-top", "-nodecount", "60", str(merged)],
            check=True,
            capture_output=True,
            text=True,
        )
        self.out.with_name(f"{self.out.name}.txt").write_text(top.stdout)
        traces = subprocess.run(
            [go, "tool", "pprof", "-traces", str(merged)], check=True, capture_output=True, text=True
        )
        samples = parse_traces(traces.stdout)
        return {"profile": str(merged), "chunks": len(self._chunks), **breakdown(samples)}


def _seconds(value: str) -> float:
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    raise ValueError(f"not a duration: {value!r}")


def parse_traces(text: str) -> list[tuple[float, list[str]]]:
    """``go tool pprof -traces`` -> [(CPU seconds, frames leaf first)]."""
    samples: list[tuple[float, list[str]]] = []
    for block in text.split("-----------+-------------------------------------------------------")[1:]:
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        head = lines[0].split()
        if len(head) < 2:
            continue
        try:
            value = _seconds(head[0])
        except ValueError:
            continue
        frames = [head[1]] + [line.strip() for line in lines[1:]]
        samples.append((value, frames))
    return samples


def _classify(frames: list[str], table: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    # The table's order is the priority: a patch's JSON work is the patch's, an audit event's
    # encoding is audit's, whatever frame of the stack names them.
    for label, needles in table:
        if any(needle in frame for frame in frames for needle in needles):
            return label
    return "other"


def breakdown(samples: list[tuple[float, list[str]]]) -> dict[str, Any]:
    by_entry: defaultdict[str, float] = defaultdict(float)
    by_work: defaultdict[str, float] = defaultdict(float)
    for seconds, frames in samples:
        by_entry[_classify(frames, ENTRIES)] += seconds
        by_work[_classify(frames, WORK)] += seconds
    total = sum(by_entry.values())
    return {
        "cpu_seconds": round(total, 3),
        "by_request_kind": {k: round(v, 3) for k, v in sorted(by_entry.items(), key=lambda kv: -kv[1])},
        "by_kind_of_work": {k: round(v, 3) for k, v in sorted(by_work.items(), key=lambda kv: -kv[1])},
    }
