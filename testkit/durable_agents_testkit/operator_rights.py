"""The operator's rights as the chart grants them, for the operators the test kit starts as a user
(the e2e suite, the recovery lab, the demo): a missing rule fails the suites.

* cluster-wide: ``files/operator-rules.yaml``, plus its webhook configurations: the chart renders
  them and grants ``get``, ``update`` by name; outside the chart the operator creates its own
  (each test's operator names its own), so ``create`` too here;
* in each namespace the test kit makes: ``files/operator-namespace-rules.yaml`` (impersonating the
  namespace's ServiceAccounts: the namespace is managed) and ``files/operator-lease-rules.yaml``
  (a test's operator keeps its Leases in the namespace it watches). A test of a namespace that is
  not managed makes its namespace without them (e2e/test_managed_namespaces.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client

from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.rbac import Rule, bind, grant, grant_cluster, rule, service_account

FILES = Path(__file__).resolve().parents[2] / "charts" / "durable-agents" / "files"
OPERATOR_USER = "durable-agents-operator"


def _rules(name: str) -> list[Rule]:
    rules: list[Rule] = yaml.safe_load((FILES / name).read_text())
    return rules


def cluster_rules() -> list[Rule]:
    webhooks = ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    return [
        *_rules("operator-rules.yaml"),
        rule("admissionregistration.k8s.io", webhooks, "get", "create", "update"),
    ]


def namespace_rules(*, leases: bool = True) -> list[Rule]:
    return [
        *_rules("operator-namespace-rules.yaml"),
        *(_rules("operator-lease-rules.yaml") if leases else []),
    ]


def grant_operator(
    kube: KubeEnv | client.ApiClient, who: str = OPERATOR_USER, *, name: str = OPERATOR_USER
) -> None:
    grant_cluster(kube, who, cluster_rules(), name=name, exist_ok=True)


def manage(
    kube: KubeEnv | client.ApiClient, namespace: str, who: str = OPERATOR_USER, *, leases: bool = True
) -> None:
    """Opt ``namespace`` in for the operator ``who`` (and keep its Leases there)."""
    grant(kube, namespace, who, namespace_rules(leases=leases), name=who, exist_ok=True)


def leases_only(kube: KubeEnv | client.ApiClient, namespace: str, who: str = OPERATOR_USER) -> None:
    """The operator's Leases in ``namespace``, nothing else: its own namespace, not a managed one."""
    grant(kube, namespace, who, _rules("operator-lease-rules.yaml"), name=f"{who}-leases", exist_ok=True)


def opt_in_args(namespace: str, release: str, operator_namespace: str) -> list[str]:
    """The kubectl arguments that opt ``namespace`` in for the chart's operator (release
    ``release`` in ``operator_namespace``), as docs/security/operator-rbac.md gives them."""
    fullname = f"{release}-durable-agents"
    return [
        *("create", "rolebinding", "durable-agents", "-n", namespace),
        f"--clusterrole={fullname}-managed-namespace",
        f"--serviceaccount={operator_namespace}:{fullname}",
    ]


def opt_in(kube: KubeEnv | client.ApiClient, namespace: str, release: str, operator_namespace: str) -> None:
    """The same RoleBinding as :func:`opt_in_args`, made through the API."""
    fullname = f"{release}-durable-agents"
    account = service_account(fullname, operator_namespace)
    bind(kube, namespace, account, f"{fullname}-managed-namespace", cluster_role=True, name="durable-agents")
