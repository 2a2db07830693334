"""Tracing turned on through the chart, on the node test bed: a collector Pod (the test kit's OTLP
receiver, ``durable_agents_testkit/otlp.py``, run by the operator's own image, which has the
protobuf and OpenTelemetry packages it needs, from a ConfigMap) behind a Service; the chart
installed with ``env`` naming that Service's address in ``OTEL_EXPORTER_OTLP_ENDPOINT`` (Pods here
have no DNS) and ``OTEL_SERVICE_NAME``; the demo's run started. The collector receives the run's
spans in its trace (``status.traceId``), exported by the operator's Pods under the service name
the chart's ``env`` set and each Pod's name as ``service.instance.id``."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents import __version__
from durable_agents_testkit import demo_cluster, otlp
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.demo import prepare_namespace
from durable_agents_testkit.eventually import eventually
from durable_agents_testkit.localcluster.node import NodeTestBed
from durable_agents_testkit.operator_rights import opt_in
from durable_agents_testkit.runs import Runs

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/durable-agents"
IMAGE = f"localhost/durable-agents:{__version__}"
RELEASE, OPERATOR_NS, COLLECTOR_NS = "da", "durable-agents-system", "otel"
SERVICE_NAME = "durable-agents-incluster"
PORT = 4318


def run(argv: list[str], timeout: float = 300) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ), check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def helm(bed: NodeTestBed, *args: str, timeout: float = 300) -> str:
    return run([str(bed.bin_dir / "helm"), "--kubeconfig", str(bed.kubeconfig_path), *args], timeout=timeout)


@pytest.fixture(scope="module")
def env(node_bed: NodeTestBed, operator_image_archive: Path) -> KubeEnv:
    node_bed.import_image(operator_image_archive, IMAGE)
    assert node_bed.plane is not None
    return KubeEnv.local(node_bed.plane)


def collector_objects() -> list[dict[str, Any]]:
    labels = {"app": "otlp-collector"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "otlp-receiver"},
            "data": {"otlp.py": Path(otlp.__file__).read_text()},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "otlp-collector", "labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "receiver",
                        "image": IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/opt/durable-agents/bin/python", "/receiver/otlp.py", f"0.0.0.0:{PORT}"],
                        "ports": [{"name": "otlp-http", "containerPort": PORT}],
                        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "receiver", "mountPath": "/receiver", "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "receiver", "configMap": {"name": "otlp-receiver"}}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "otlp-collector"},
            "spec": {"selector": labels, "ports": [{"port": PORT, "targetPort": "otlp-http"}]},
        },
    ]


@pytest.fixture(scope="module")
def collector(node_bed: NodeTestBed, env: KubeEnv) -> Iterator[str]:
    """The collector Pod Ready behind its Service; the OTLP endpoint (the Service's address)."""
    core = client.CoreV1Api(env.api)
    core.create_namespace({"metadata": {"name": COLLECTOR_NS}})
    node_bed.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", COLLECTOR_NS, "--timeout=30s", check=True
    )
    applied = node_bed.kubectl(
        "apply", "-n", COLLECTOR_NS, "-f", "-", input=yaml.safe_dump_all(collector_objects())
    )
    assert applied.returncode == 0, applied.stderr
    waited = node_bed.kubectl(
        "wait", "-n", COLLECTOR_NS, "--for=condition=Ready", "pod/otlp-collector", "--timeout=120s"
    )
    assert waited.returncode == 0, (
        f"the collector Pod is not Ready: {waited.stderr}\n{collector_log(node_bed)}"
    )
    address = core.read_namespaced_service("otlp-collector", COLLECTOR_NS).spec.cluster_ip
    yield f"http://{address}:{PORT}"
    core.delete_namespace(COLLECTOR_NS)


def collector_log(bed: NodeTestBed) -> str:
    done = bed.kubectl("logs", "-n", COLLECTOR_NS, "pod/otlp-collector")
    return str(done.stdout) if done.returncode == 0 else f"(kubectl logs: {done.stderr})"


def received(bed: NodeTestBed) -> list[dict[str, Any]]:
    """The spans the collector logged (one JSON line each)."""
    return [json.loads(line) for line in collector_log(bed).splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def traced_install(
    node_bed: NodeTestBed, env: KubeEnv, collector: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The chart installed with tracing turned on through its ``env`` value only."""
    values = tmp_path_factory.mktemp("values") / "tracing.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"tag": __version__, "pullPolicy": "Never"},
                "env": [
                    {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": collector},
                    {"name": "OTEL_SERVICE_NAME", "value": SERVICE_NAME},
                    {"name": "OTEL_BSP_SCHEDULE_DELAY", "value": "200"},
                ],
            }
        )
    )
    try:
        helm(
            node_bed, "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
            "--values", str(values), "--wait", "--timeout", "180s",
        )  # fmt: skip
        demo_cluster.await_webhook_service(node_bed, OPERATOR_NS)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{demo_cluster.diagnosis(node_bed, RELEASE, OPERATOR_NS)}") from None
    yield
    subprocess.run(
        [str(node_bed.bin_dir / "helm"), "--kubeconfig", str(node_bed.kubeconfig_path), "uninstall", RELEASE,
         "--namespace", OPERATOR_NS, "--wait"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def test_tracing_turned_on_through_the_chart_reaches_a_collector_pod(
    node_bed: NodeTestBed, env: KubeEnv, traced_install: None
) -> None:
    ns = f"traced-{uuid.uuid4().hex[:6]}"
    prepare_namespace(env, ns)
    opt_in(env, ns, RELEASE, OPERATOR_NS)
    try:
        node_bed.kubectl(
            "-n", ns, "apply", "-f", str(REPO / "config/samples/agentpolicy-default.yaml"), check=True
        )
        runs = Runs(env, ns)
        runs.await_webhook()
        node_bed.kubectl(
            "-n", ns, "apply", "-f", str(REPO / "config/samples/agentrun-rollout.yaml"), check=True
        )
        parked = runs.wait_state("rollout", "waiting_input", timeout=60)
        trace_id = parked["status"]["traceId"]
        pods = {
            p.metadata.name
            for p in client.CoreV1Api(env.api)
            .list_namespaced_pod(OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}")
            .items
        }

        def of_the_run() -> list[dict[str, Any]]:
            return [s for s in received(node_bed) if s["trace_id"] == trace_id]

        start = time.monotonic()
        try:
            eventually(
                lambda: any(s["name"].startswith("transition ") for s in of_the_run()), 60, "the run's spans"
            )
        except TimeoutError as err:
            raise AssertionError(
                f"no span of trace {trace_id} reached the collector:\n{collector_log(node_bed)[-4000:]}\n"
                f"{demo_cluster.diagnosis(node_bed, RELEASE, OPERATOR_NS)}"
            ) from err
        print(f"\nfirst span of the run at the collector after {time.monotonic() - start:.1f}s", flush=True)
        spans = of_the_run()
        # Exported by the operator's Pods, under the name the chart's env gave them.
        assert {s["resource"]["service.name"] for s in spans} == {SERVICE_NAME}
        assert {s["resource"]["service.instance.id"] for s in spans} <= pods, pods
        run = f"{ns}/rollout"
        assert run in {s["attributes"].get("durable_agents.run") for s in spans}, spans
    finally:
        client.CoreV1Api(env.api).delete_namespace(ns)
