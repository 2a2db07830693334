"""Pods really run on the node test bed: a local image, the API server through the kubernetes
Service with a ServiceAccount token, a Service reached from the API server's side, exec and logs
through the kubelet, and a guard that keeps Pods off the machine's other ports."""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
import urllib.request
from collections.abc import Iterator, Mapping

import pytest
import yaml

from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.node import NODE_NAME, NodeTestBed

WAIT = "--timeout=60s"


def _apply(bed: NodeTestBed, namespace: str, *docs: Mapping[str, object]) -> None:
    text = yaml.safe_dump_all(docs)
    bed.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=True)


def _probe_pod(bed: NodeTestBed, name: str, args: list[str], **spec: object) -> dict[str, object]:
    container: dict[str, object] = {
        "name": "probe",
        "image": bed.probe_image,
        "imagePullPolicy": "Never",  # nothing can be pulled here: the image was built locally
        "args": args,
    }
    if args[:1] == ["serve"]:
        container["ports"] = [{"containerPort": 8080}]
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }


def _serve(bed: NodeTestBed, namespace: str, name: str) -> None:
    _apply(bed, namespace, _probe_pod(bed, name, ["serve"]))
    bed.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", WAIT, check=True)


def test_node_is_ready_and_schedulable(node_bed: NodeTestBed) -> None:
    node = json.loads(node_bed.kubectl("get", "node", NODE_NAME, "-o", "json", check=True).stdout)
    assert not node["spec"].get("taints"), node["spec"]
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert node_bed.network is not None
    assert addresses["InternalIP"] == node_bed.network.node_address
    assert not ipaddress.ip_address(addresses["InternalIP"]).is_loopback


def test_pod_with_a_locally_built_image_becomes_ready(node_bed: NodeTestBed, node_namespace: str) -> None:
    _serve(node_bed, node_namespace, "web")
    pod = json.loads(node_bed.kubectl("get", "pod", "web", "-n", node_namespace, "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["containerStatuses"][0]["image"].endswith(node_bed.probe_image.split("/", 1)[1])
    assert node_bed.network is not None
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(node_bed.network.pod_cidr)


def test_pod_reaches_the_api_server_through_the_kubernetes_service_with_its_token(
    node_bed: NodeTestBed, node_namespace: str
) -> None:
    _apply(node_bed, node_namespace, _probe_pod(node_bed, "whoami", ["whoami"], restartPolicy="Never"))
    node_bed.kubectl(
        "wait",
        "-n",
        node_namespace,
        "--for=jsonpath={.status.phase}=Succeeded",
        "pod/whoami",
        WAIT,
        check=True,
    )
    # kubectl logs: the API server reads them from the kubelet with its client certificate.
    logs = node_bed.kubectl("logs", "-n", node_namespace, "whoami", check=True).stdout
    answer = json.loads(logs.strip().splitlines()[-1])
    assert answer["username"] == f"system:serviceaccount:{node_namespace}:default"
    assert node_bed.network is not None
    assert answer["server"] == f"{node_bed.network.kubernetes_service_ip}:443"


def test_service_in_front_of_a_pod_is_reached_from_the_api_server_side(
    node_bed: NodeTestBed, node_namespace: str
) -> None:
    _serve(node_bed, node_namespace, "backend")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend"},
        "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    _apply(node_bed, node_namespace, service)
    node_bed.kubectl(
        "wait",
        "-n",
        node_namespace,
        "--for=jsonpath={.endpoints[0].conditions.ready}=true",
        "endpointslice",
        "-l",
        "kubernetes.io/service-name=backend",
        WAIT,
        check=True,
    )
    # The API server's service proxy dials the endpoint from the machine, through the veth.
    raw = f"/api/v1/namespaces/{node_namespace}/services/http:backend:80/proxy/"
    assert node_bed.kubectl("get", "--raw", raw, check=True).stdout.strip() == "probe backend"
    # The ClusterIP from the machine (as the API server calls a webhook's Service): kube-proxy's
    # rules in the node's namespace carry it.
    cluster_ip = node_bed.kubectl(
        "get", "service", "backend", "-n", node_namespace, "-o", "jsonpath={.spec.clusterIP}", check=True
    ).stdout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def through_cluster_ip() -> str | None:
        try:
            with opener.open(f"http://{cluster_ip}/", timeout=5) as resp:
                return str(resp.read().decode().strip())
        except OSError:
            return None  # kube-proxy programs a new Service's rules within a second or so

    assert (
        eventually(through_cluster_ip, Within.COMMIT, f"{cluster_ip} through kube-proxy") == "probe backend"
    )


def test_exec_reaches_the_container_through_the_kubelet(node_bed: NodeTestBed, node_namespace: str) -> None:
    _serve(node_bed, node_namespace, "execd")
    result = node_bed.kubectl(
        "exec",
        "-n",
        node_namespace,
        "execd",
        "--",
        "/probe",
        "get",
        "http://127.0.0.1:8080/healthz",
        check=True,
    )
    assert result.stdout.strip() == "ok"


@pytest.fixture
def host_listener(node_bed: NodeTestBed) -> Iterator[str]:
    """An HTTP server on the machine's end of the node's veth (not the API server's port)."""
    assert node_bed.network is not None

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((node_bed.network.host_address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{node_bed.network.host_address}:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_pod_reaches_no_other_port_of_the_machine(
    node_bed: NodeTestBed, node_namespace: str, host_listener: str
) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(host_listener, timeout=5) as resp:  # the listener is there
        assert resp.read() == b"host"
    _serve(node_bed, node_namespace, "guarded")
    result = node_bed.kubectl(
        "exec", "-n", node_namespace, "guarded", "--", "/probe", "get", "-timeout=3s", host_listener
    )
    assert result.returncode != 0, result.stdout
    assert "timeout" in result.stderr or "deadline" in result.stderr.lower(), result.stderr
