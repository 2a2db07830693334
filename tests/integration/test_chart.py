"""The Helm chart is valid: `helm lint --strict` is clean, and what `helm template` renders (with the
defaults and with other values the chart supports) is accepted by the real API server in a
server-side dry run, every object, without a warning (the release namespace warns of anything
below the "restricted" Pod Security level). Every render holds the objects the operator needs,
each optional object follows its switch, what an object names is in the render, and
values.schema.json refuses a mistyped value, naming it.

helm is built from Go modules by hack/build.sh (`make binaries`, which `make test` runs) into the
directory with kubectl: a missing helm fails these tests, it does not skip them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.shell.admission import registration
from durable_agents_testkit.cluster import KubeEnv, install_crds
from durable_agents_testkit.localcluster.controlplane import ensure_binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "durable-agents"
RELEASE = "chart-test"
TIMEOUT = 60.0

# What every render must hold, whatever the values: the operator, its identity and its rights,
# and the admission policy that lets only the operator write its records.
ALWAYS = {
    ("apps/v1", "Deployment"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
}
# Objects behind a switch in values.yaml: rendered exactly when the switch is on (a switch the
# chart's values do not have is not checked).
SWITCHED = {
    "podDisruptionBudget.enabled": "PodDisruptionBudget",
    "networkPolicy.enabled": "NetworkPolicy",
    "monitoring.serviceMonitor.enabled": "ServiceMonitor",
    "monitoring.prometheusRule.enabled": "PrometheusRule",
}

# The operator's egress built from the policies' destinations (issue 32, item 7).
EGRESS: dict[str, Any] = {
    "enabled": True,
    "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]},
    "destinations": [
        {"url": "https://payments.example.com/v1", "to": [{"ipBlock": {"cidr": "203.0.113.10/32"}}]},
        {"url": "HTTP://tickets.example.com:8080/mcp", "to": [{"ipBlock": {"cidr": "203.0.113.11/32"}}]},
    ],
}

# Values the chart supports besides its defaults, each rendered, linted and dry-run applied.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "one-replica-other-region": {
        "replicas": 1,
        "region": "eu-west-1",
        "shards": 4,
        "leaseDurationSeconds": 30,
        "logLevel": "DEBUG",
        "managedNamespaces": ["team-a", "team-b"],
    },
    "namespaced-without-optional-objects": {
        "replicas": 3,
        "watchNamespace": "team-a",
        "webhook": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "userRoles": {"create": False},
    },
    "own-keys-network-policy-scheduling": {
        "sealing": {"secretName": "team-keys", "activeKey": "key-2"},
        "webhook": {"configurationName": "durable-agents-team-a", "port": 10443},
        "networkPolicy": {"enabled": True},
        "podDisruptionBudget": {"maxUnavailable": "50%"},
        "image": {"repository": "registry.example.com/durable-agents", "tag": "1.2.3"},
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "ops"},
    },
    "egress-network-policy": {
        # both NetworkPolicies (the SWITCHED check looks at the kind): ingress and egress
        "networkPolicy": {"enabled": True, "egress": EGRESS},
    },
    "cert-manager-self-signed": {"webhook": {"certManager": {"enabled": True}}},
    "monitoring": {
        "monitoring": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
            "prometheusRule": {"enabled": True, "approvalWaitSeconds": 600, "stuckFor": "1m"},
            "dashboard": {"enabled": True},
        }
    },
    # The operator's Pod as a platform team tunes it (issue 37, item 4).
    "operator-knobs": {
        "env": [
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.monitoring:4318"},
            {"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "otel-settings"}}],
        "extraVolumes": [{"name": "corp-ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        "priorityClassName": "platform-critical",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "probes": {
            "liveness": {"periodSeconds": 20, "timeoutSeconds": 3},
            "readiness": {"failureThreshold": 5},
        },
        "podLabels": {"example.com/team": "ops"},
        "podAnnotations": {"example.com/owner": "platform"},
    },
    "cert-manager-cluster-issuer": {
        "webhook": {
            "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
        },
    },
}

# kubectl apply's line per object: "<resource>[.<group>]/<name> <verb> (server dry run)".
APPLIED = re.compile(
    r"^(?P<resource>[a-z0-9.-]+)/(?P<name>\S+) (?P<verb>created|configured|unchanged) \(server dry run\)$"
)


def pinned(name: str) -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{name} missing from hack/versions.env")


def run(argv: list[str], *, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"{' '.join(result.args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and out[key]:
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def missing_keys(defaults: dict[str, Any], overlay: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of overlay the chart's values.yaml does not have (the chart moved on)."""
    missing: list[str] = []
    for key, value in overlay.items():
        if key not in defaults:
            missing.append(prefix + key)
        elif isinstance(value, dict) and isinstance(defaults[key], dict) and defaults[key]:
            missing += missing_keys(defaults[key], value, f"{prefix}{key}.")
    return missing


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """Where hack/build.sh puts kubectl and helm (DURABLE_AGENTS_BIN_DIR when set)."""
    directory = ensure_binaries(controller_manager=False)
    helm = directory / "helm"
    if not helm.is_file():
        pytest.fail(
            f"helm is missing from {directory}: `make binaries` (hack/build.sh) builds it from "
            "hack/helm (helm.sh/helm/v3 at HELM_VERSION in hack/versions.env); "
            "`make test` runs it first",
            pytrace=False,
        )
    return directory


@pytest.fixture(scope="module")
def helm(bin_dir: Path) -> str:
    return str(bin_dir / "helm")


@pytest.fixture(scope="module")
def chart_crds(kube: KubeEnv, cert_manager_crds: Path, prometheus_operator_crds: Path) -> list[str]:
    """The chart's own CRDs, known to the server (the objects the policy names are theirs),
    cert-manager's (the Certificate and Issuer of ``webhook.certManager``) and the Prometheus
    operator's (the ServiceMonitor and PrometheusRule of ``monitoring``)."""
    return (
        install_crds(kube.api, CHART / "crds")
        + install_crds(kube.api, cert_manager_crds)
        + install_crds(kube.api, prometheus_operator_crds)
    )


@pytest.fixture(scope="module")
def cert_manager_crds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cert-manager's CRDs at CERT_MANAGER_VERSION, from its Go module (``go mod download``: the
    module proxy, like every other Kubernetes part here): its schema judges the chart's objects."""
    version = pinned("CERT_MANAGER_VERSION")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    done = subprocess.run(
        [go, "mod", "download", "-json", f"github.com/cert-manager/cert-manager@{version}"],
        cwd=tmp_path_factory.mktemp("gomod"), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"go mod download cert-manager {version}: {done.stdout}{done.stderr}"
    crds = Path(json.loads(done.stdout)["Dir"]) / "deploy" / "crds"
    assert sorted(p.name for p in crds.glob("cert-manager.io_*.yaml")), f"no CRDs in {crds}"
    return crds


@pytest.fixture(scope="module")
def prometheus_operator_crds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Prometheus operator's ServiceMonitor and PrometheusRule CRDs at PROMETHEUS_OPERATOR_VERSION,
    from its Go module (example/prometheus-operator-crd), as cert-manager's above."""
    version = pinned("PROMETHEUS_OPERATOR_VERSION")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    module = f"github.com/prometheus-operator/prometheus-operator@{version}"
    done = subprocess.run(
        [go, "mod", "download", "-json", module],
        cwd=tmp_path_factory.mktemp("gomod"), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"go mod download {module}: {done.stdout}{done.stderr}"
    source = Path(json.loads(done.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    crds = tmp_path_factory.mktemp("prometheus-operator-crds")
    for kind in ("servicemonitors", "prometheusrules"):
        shutil.copy(source / f"monitoring.coreos.com_{kind}.yaml", crds)
    return crds


@pytest.fixture(params=sorted(VALUE_SETS))
def values_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    overlay = VALUE_SETS[request.param]
    defaults = default_values()
    missing = missing_keys(defaults, overlay)
    assert not missing, f"charts/durable-agents/values.yaml no longer has {', '.join(missing)}"
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return path, merged(defaults, overlay)


def render(helm: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    argv = [helm, "template", RELEASE, str(CHART), "--namespace", namespace]
    out = ok(run([*argv, "--kube-version", pinned("KUBERNETES_VERSION"), *args]))
    return [doc for doc in yaml.safe_load_all(out) if doc]


def resource_key(doc: dict[str, Any]) -> str:
    """How kubectl names the object: "<kind>[.<group>]/<name>", lower-case kind."""
    group = doc["apiVersion"].rpartition("/")[0]
    kind = doc["kind"].lower() + (f".{group}" if group else "")
    return f"{kind}/{doc['metadata']['name']}"


def webhook_ports(service: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        port for port in service["spec"]["ports"] if "webhook" in (port.get("name"), port.get("targetPort"))
    ]


def test_helm_is_the_pinned_version(helm: str) -> None:
    version = ok(run([helm, "version", "--template", "{{.Version}}"])).strip()
    assert version == pinned("HELM_VERSION")


def test_lint_strict_is_clean(helm: str, values_file: tuple[Path, dict[str, Any]]) -> None:
    path, _ = values_file
    out = ok(run([helm, "lint", "--strict", str(CHART), "--values", str(path)]))
    assert "0 chart(s) failed" in out, out
    assert not re.search(r"^\[(WARNING|ERROR)\]", out, re.MULTILINE), out


def test_render_is_accepted_by_the_api_server(
    kube: KubeEnv,
    bin_dir: Path,
    helm: str,
    chart_crds: list[str],
    namespace: str,
    values_file: tuple[Path, dict[str, Any]],
) -> None:
    path, values = values_file
    # A Pod the Deployment makes must be admissible where Pod Security is "restricted".
    client.CoreV1Api(kube.api).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/warn": "restricted"}}}
    )
    docs = render(helm, namespace, "--values", str(path))

    keys = [resource_key(doc) for doc in docs]
    placed = [(doc["metadata"].get("namespace"), key) for doc, key in zip(docs, keys, strict=True)]
    duplicates = [key for key, count in Counter(placed).items() if count > 1]
    assert not duplicates, f"rendered twice: {duplicates}"
    kinds = {(doc["apiVersion"], doc["kind"]) for doc in docs}
    assert kinds >= ALWAYS, f"missing from the render: {sorted(ALWAYS - kinds)}"
    for switch, kind in SWITCHED.items():
        try:
            on = bool(lookup(values, switch))
        except KeyError:
            continue
        assert (kind in {k for _, k in kinds}) == on, f"{kind} with {switch}={on}"
    if "webhook" in values and "enabled" in values["webhook"]:
        serving = [doc for doc in docs if doc["kind"] == "Service" and webhook_ports(doc)]
        assert bool(serving) == bool(values["webhook"]["enabled"]), (
            f"a Service for the webhook with webhook.enabled={values['webhook']['enabled']}"
        )
        configured = {k for _, k in kinds} & {
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        }
        assert bool(configured) == bool(values["webhook"]["enabled"]), "webhook configurations"

    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(kube.kubeconfig)]
    # The RoleBindings of the managed namespaces are made in those (each made here if missing).
    where: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        where.setdefault(doc["metadata"].get("namespace") or namespace, []).append(doc)
    lines: list[str] = []
    stderr: list[str] = []
    for ns, those in where.items():
        if ns != namespace:
            run([*kubectl, "create", "namespace", ns])  # already there from another value set: fine
        applied = [*kubectl, "--namespace", ns, "apply", "--dry-run=server", "-f", "-"]
        result = run(applied, input=yaml.safe_dump_all(those))
        ok(result)
        lines += result.stdout.splitlines()
        stderr += result.stderr.splitlines()
    refused = [line for line in lines if not APPLIED.match(line)]
    assert not refused, f"not accepted in the server dry run: {refused}\n{stderr}"
    accepted = {f"{m['resource']}/{m['name']}" for m in map(APPLIED.match, lines) if m}
    assert accepted == set(keys), (
        f"rendered, not applied: {sorted(set(keys) - accepted)}; "
        f"applied, not rendered: {sorted(accepted - set(keys))}"
    )
    warnings = [line for line in stderr if line.strip()]
    assert not warnings, "the API server warned:\n" + "\n".join(warnings)


def test_render_references_resolve(helm: str, values_file: tuple[Path, dict[str, Any]]) -> None:
    """What the Deployment, bindings, Service and budget name is in the render (or the user's)."""
    path, values = values_file
    docs = render(helm, "ns", "--values", str(path))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    [deployment] = by_kind["Deployment"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items(), "the Deployment does not select its own Pods"
    if "replicas" in values:
        assert deployment["spec"]["replicas"] == values["replicas"]

    # Service links would put DURABLE_AGENTS_<SERVICE>_* variables in the operator's environment
    # (the webhook's Service, when the release is named durable-agents): refused as unknown.
    assert pod["spec"]["enableServiceLinks"] is False

    accounts = {doc["metadata"]["name"] for doc in by_kind["ServiceAccount"]}
    assert pod["spec"]["serviceAccountName"] in accounts
    roles = {doc["metadata"]["name"] for doc in by_kind["ClusterRole"]}
    for binding in by_kind["ClusterRoleBinding"] + by_kind.get("RoleBinding", []):
        if binding["roleRef"]["kind"] == "ClusterRole":
            assert binding["roleRef"]["name"] in roles, binding["metadata"]["name"]
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                assert subject["name"] in accounts, subject
                assert subject["namespace"] == "ns", subject

    for kind in ("Service", "PodDisruptionBudget"):
        for doc in by_kind.get(kind, []):
            chosen = doc["spec"]["selector"]
            chosen = chosen.get("matchLabels", chosen) if kind == "PodDisruptionBudget" else chosen
            assert chosen.items() <= labels.items(), f"{kind} {doc['metadata']['name']} selects no Pod"
    ports = {port["name"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
    for service in by_kind.get("Service", []):
        for port in service["spec"]["ports"]:
            target = port.get("targetPort")
            assert not isinstance(target, str) or target in ports, f"no container port named {target}"

    secrets = {doc["metadata"]["name"] for doc in by_kind.get("Secret", [])}
    own = values.get("sealing", {}).get("secretName", "")
    for volume in pod["spec"].get("volumes", []):
        if "secret" in volume and volume["secret"]["secretName"] != own:
            assert volume["secret"]["secretName"] in secrets, volume["name"]


SCHEMA_CASES = {
    "replicas": ("--set", "replicas=many"),
    "env/0/value": ("--set", "env[0].name=OTEL_BSP_SCHEDULE_DELAY,env[0].value=50"),
    "priorityClassName": ("--set", "priorityClassName=5"),
    "probes/liveness/periodSeconds": ("--set", "probes.liveness.periodSeconds=often"),
    "topologySpreadConstraints/0/whenUnsatisfiable": (
        "--set",
        "topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=zone,"
        "topologySpreadConstraints[0].whenUnsatisfiable=Sometimes",
    ),
    "leaseDurationSeconds": ("--set", "leaseDurationSeconds=abc"),
    "region": ("--set", "region=Not_A_DNS_Label"),
    "podDisruptionBudget/maxUnavailable": ("--set", "podDisruptionBudget.maxUnavailable=abc"),
}


@pytest.mark.parametrize("value", sorted(SCHEMA_CASES))
def test_schema_refuses_a_wrong_value_by_name(helm: str, value: str) -> None:
    result = run([helm, "template", RELEASE, str(CHART), *SCHEMA_CASES[value]])
    assert result.returncode != 0, f"helm template accepted {SCHEMA_CASES[value][1]}"
    assert f"'/{value}'" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("setting", "unknown"),
    [
        ("replica=3", "replica"),
        ("probes.liveness.period=3", "period"),
        ("env[0].name=NO_PROXY,env[0].val=x", "val"),
        ("environment[0].name=NO_PROXY", "environment"),
    ],
)
def test_schema_refuses_a_misspelt_value(helm: str, setting: str, unknown: str) -> None:
    result = run([helm, "template", RELEASE, str(CHART), "--set", setting])
    assert result.returncode != 0, f"helm template accepted the unknown value {unknown}"
    assert f"'{unknown}'" in result.stderr, result.stderr


def test_two_listeners_on_one_port_are_refused(helm: str) -> None:
    result = run(
        [helm, "template", RELEASE, str(CHART), "--set", "healthPort=8080", "--set", "metricsPort=8080"]
    )
    assert result.returncode != 0, "helm template accepted healthPort == metricsPort"
    assert "must differ" in result.stderr, result.stderr


@pytest.mark.parametrize("watched", ["", "team-a"])
def test_the_webhook_configurations_are_the_operators_own(helm: str, watched: str) -> None:
    """What the chart installs is what the operator would install (so it writes nothing at start-up
    but the caBundle), calling the webhook Service with failurePolicy Fail."""
    docs = render(helm, "ops", "--set", f"watchNamespace={watched}")
    [service] = [d for d in docs if d["kind"] == "Service" and webhook_ports(d)]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    name = env["DURABLE_AGENTS_WEBHOOK_CONFIGURATION"]
    assert env["DURABLE_AGENTS_WEBHOOK_SERVICE"] == service["metadata"]["name"]
    wanted = registration.webhook_configurations(
        name=name,
        service=("ops", service["metadata"]["name"], int(env["DURABLE_AGENTS_WEBHOOK_SERVICE_PORT"] or 0)),
        ca_pem=b"",
        namespace=watched or None,
    )
    for want in wanted:
        [have] = [d for d in docs if d["kind"] == want["kind"]]
        assert have["metadata"]["name"] == name
        for hook in want["webhooks"]:
            del hook["clientConfig"]["caBundle"]  # filled in from the serving Secret, or by the operator
        assert have["webhooks"] == want["webhooks"]
        assert {h["failurePolicy"] for h in have["webhooks"] if "agentruns" in h["name"]} == {"Fail"}


def test_with_cert_manager_the_operator_may_only_read_its_certificate(helm: str) -> None:
    """webhook.certManager: a Certificate for the webhook's Service names into the Secret the
    operator is told to read, as cert-manager's issuer; the operator's Role cannot write it."""
    docs = render(helm, "ops", "--set", "webhook.certManager.enabled=true")
    [service] = [d for d in docs if d["kind"] == "Service" and webhook_ports(d)]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DURABLE_AGENTS_WEBHOOK_CERT_ISSUER"] == "cert-manager"
    [certificate] = [d for d in docs if d["kind"] == "Certificate"]
    [issuer] = [d for d in docs if d["kind"] == "Issuer"]
    assert certificate["spec"]["secretName"] == env["DURABLE_AGENTS_WEBHOOK_CERT_SECRET"]
    name = service["metadata"]["name"]
    assert f"{name}.ops.svc" in certificate["spec"]["dnsNames"]  # the name the API server calls
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert "selfSigned" in issuer["spec"]
    verbs = {
        verb
        for role in docs
        if role["kind"] == "Role"
        for rule in role["rules"]
        if "secrets" in rule["resources"]
        for verb in rule["verbs"]
    }
    assert verbs == {"get"}, f"the operator may {sorted(verbs)} secrets with cert-manager issuing"
    default = render(helm, "ops")
    assert not [d for d in default if d["kind"] in ("Certificate", "Issuer")], "cert-manager is opt-in"
    [deployment] = [d for d in default if d["kind"] == "Deployment"]
    names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "DURABLE_AGENTS_WEBHOOK_CERT_ISSUER" not in names


def test_the_egress_network_policy_takes_each_destinations_port_from_its_url(
    helm: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"egress": EGRESS}}))
    docs = render(helm, "ns", "--values", str(path))
    policies = {tuple(doc["spec"]["policyTypes"]): doc for doc in docs if doc["kind"] == "NetworkPolicy"}
    assert set(policies) == {("Ingress",), ("Egress",)}, (
        "the ingress policy is on by default, the egress asked"
    )
    egress = policies[("Egress",)]
    ports = [([p["port"] for p in rule["ports"]], rule.get("to")) for rule in egress["spec"]["egress"]]
    assert ports[0] == ([443, 6443], EGRESS["apiServer"]["to"]), "the API server first"
    assert ports[1][0] == [53, 53], "cluster DNS"
    assert ports[2:] == [([443], EGRESS["destinations"][0]["to"]), ([8080], EGRESS["destinations"][1]["to"])]


@pytest.mark.parametrize(
    ("egress", "said"),
    [
        ({"enabled": True}, "networkPolicy.egress.apiServer.to"),
        ({**EGRESS, "destinations": [{"url": "https://a.example/", "to": []}]}, "to"),
        (
            {
                **EGRESS,
                "destinations": [
                    {"url": "https://u@a.example/", "to": [{"ipBlock": {"cidr": "1.2.3.4/32"}}]}
                ],
            },
            "url",
        ),
    ],
)
def test_an_egress_that_would_allow_everything_or_names_no_url_is_refused(
    helm: str, tmp_path: Path, egress: dict[str, Any], said: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"egress": egress}}))
    result = run([helm, "template", RELEASE, str(CHART), "--values", str(path)])
    assert result.returncode != 0, f"helm template accepted {egress}"
    assert said in result.stderr, result.stderr


def test_the_console_holds_no_rights_and_no_token(helm: str) -> None:
    """console.enabled: its ServiceAccount is bound to nothing and mounts no token; it acts only
    with each request's bearer token (docs/console.md). Off by default."""
    assert not [d for d in render(helm, "ops") if "console" in d["metadata"]["name"]], "the console is opt-in"
    ok(run([helm, "lint", "--strict", str(CHART), "--set", "console.enabled=true,console.namespace=team-a"]))
    docs = render(helm, "ops", "--set", "console.enabled=true")
    [account] = [
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-console")
    ]
    assert account["automountServiceAccountToken"] is False
    name = account["metadata"]["name"]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    bound = [
        b["metadata"]["name"] for b in bindings for s in b.get("subjects") or [] if s.get("name") == name
    ]
    assert bound == [], f"the console's ServiceAccount is bound: {bound}"
    [console] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    pod = console["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == name
    assert "--in-cluster" in pod["containers"][0]["command"]
    [operator] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != name]
    selector = operator["spec"]["selector"]["matchLabels"]
    labels = pod_labels = console["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in selector.items()), (
        f"the operator selects the console's Pods: {pod_labels}"
    )


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "operator"
    return dict(container)


def test_each_operator_knob_lands_where_it_should(helm: str, tmp_path: Path) -> None:
    knobs = VALUE_SETS["operator-knobs"]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(knobs))
    docs = render(helm, "ns", "--values", str(path))
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    container = operator_container(docs)

    # The user's variables come after the chart's, as given; the chart's are all still there.
    assert container["env"][-len(knobs["env"]) :] == knobs["env"]
    defaults = operator_container(render(helm, "ns"))
    assert container["env"][: len(defaults["env"])] == defaults["env"]
    assert container["envFrom"] == knobs["envFrom"]
    # The extra volume beside the chart's own, mounted where asked; the chart's mounts kept.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert set(volumes) == {"sealing-keys", "tmp", "corp-ca"}
    assert volumes["corp-ca"] == knobs["extraVolumes"][0]
    assert container["volumeMounts"][-1] == knobs["extraVolumeMounts"][0]
    assert container["volumeMounts"][:-1] == defaults["volumeMounts"]
    assert pod["spec"]["priorityClassName"] == "platform-critical"
    # A constraint without a selector counts this release's operator Pods (the Deployment's own).
    [spread] = pod["spec"]["topologySpreadConstraints"]
    assert spread == {
        **knobs["topologySpreadConstraints"][0],
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }
    # Probe timings: what was set, the rest at the chart's defaults; the paths are the chart's.
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    assert (liveness["periodSeconds"], liveness["timeoutSeconds"], liveness["initialDelaySeconds"]) == (
        20,
        3,
        10,
    )
    assert (readiness["failureThreshold"], readiness["periodSeconds"]) == (5, 2)
    assert liveness["httpGet"]["path"] == "/healthz"
    assert readiness["httpGet"]["path"] == "/readyz"
    assert pod["metadata"]["labels"]["example.com/team"] == "ops"
    assert pod["metadata"]["annotations"] == {"example.com/owner": "platform"}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # The defaults add none of it.
    default_pod = next(d for d in render(helm, "ns") if d["kind"] == "Deployment")["spec"]["template"]
    for key in ("priorityClassName", "topologySpreadConstraints"):
        assert key not in default_pod["spec"], key
    assert "envFrom" not in defaults


def test_a_spread_constraint_keeps_its_own_selector(helm: str) -> None:
    constraint = "topologySpreadConstraints[0]"
    docs = render(
        helm, "ns", "--set",
        f"{constraint}.maxSkew=2,{constraint}.topologyKey=kubernetes.io/hostname,"
        f"{constraint}.whenUnsatisfiable=DoNotSchedule,{constraint}.labelSelector.matchLabels.tier=ops",
    )  # fmt: skip
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": {"tier": "ops"}}


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        # Kubernetes would keep the last of two variables of one name: silently the user's or the chart's.
        (
            "env[0].name=DURABLE_AGENTS_REGION,env[0].value=eu",
            "env[0]: DURABLE_AGENTS_REGION is set by the chart from its value region",
        ),
        ("env[0].name=DURABLE_AGENTS_WORKERS,env[0].value=two", "from its value workers"),
        # The Deployment selects its Pods by the chart's labels.
        ("podLabels.app\\.kubernetes\\.io/instance=other", "podLabels.app.kubernetes.io/instance"),
        ("extraVolumes[0].name=tmp,extraVolumes[0].emptyDir.medium=Memory", "extraVolumes[0].name: tmp"),
    ],
)
def test_a_knob_that_would_override_the_charts_own_is_refused(helm: str, setting: str, said: str) -> None:
    result = run([helm, "template", RELEASE, str(CHART), "--set", setting])
    assert result.returncode != 0, f"helm template accepted {setting}"
    assert said in result.stderr, result.stderr


def test_an_env_variable_the_operator_does_not_know_stops_its_start(helm: str, tmp_path: Path) -> None:
    """The environment the chart renders, with a misspelt setting in env, given to the operator's
    own command: it exits at start-up naming the variable (as for any DURABLE_AGENTS_* typo)."""
    docs = render(
        helm, "ns", "--set-string",
        "env[0].name=DURABLE_AGENTS_DISPATCH_TIMOUT,env[0].value=9,env[1].name=OTEL_SERVICE_NAME,env[1].value=ops",
    )  # fmt: skip
    rendered = {e["name"]: e["value"] for e in operator_container(docs)["env"] if "value" in e}
    assert rendered["DURABLE_AGENTS_DISPATCH_TIMOUT"] == "9"
    operator = Path(sys.executable).with_name("durable-agents-operator")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **rendered}
    done = subprocess.run(
        [str(operator)], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode != 0, f"the operator started with an unknown variable:\n{done.stderr}"
    assert "DURABLE_AGENTS_DISPATCH_TIMOUT: unknown variable" in done.stderr, done.stderr
    assert "OTEL_SERVICE_NAME" not in done.stderr, "OpenTelemetry's variables are not the operator's settings"
