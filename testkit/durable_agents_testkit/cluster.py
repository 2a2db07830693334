"""Access to the API server under test: a kubeconfig, a client, CRD installation.

Works the same for the embedded local control plane and for an external cluster named by a
kubeconfig. Minting users with chosen groups needs the local plane's client CA; on an external
cluster, tests that need it use impersonation instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents_testkit.eventually import Within, eventually

if TYPE_CHECKING:
    from durable_agents_testkit.localcluster.controlplane import LocalControlPlane


@dataclass
class KubeEnv:
    kubeconfig: Path
    api: client.ApiClient
    plane: LocalControlPlane | None = None

    @classmethod
    def external(cls, kubeconfig: Path) -> KubeEnv:
        return cls(kubeconfig, config.new_client_from_config(config_file=str(kubeconfig)))

    @classmethod
    def local(cls, plane: LocalControlPlane) -> KubeEnv:
        path = Path(plane.kubeconfig_path)
        return cls(path, config.new_client_from_config(config_file=str(path)), plane)

    def user_client(self, name: str, groups: list[str]) -> client.ApiClient:
        """A client authenticated as an ordinary user (no system:masters)."""
        if self.plane is not None:
            path = self.plane.write_user_kubeconfig(name, groups)
            return config.new_client_from_config(config_file=str(path))
        # External cluster: act as the user through the admin's impersonation rights.
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        api.set_default_header("Impersonate-User", name)
        for group in groups:
            api.set_default_header("Impersonate-Group", group)
        return api

    def custom(self, api: client.ApiClient | None = None) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(api or self.api)


def install_crds(api: client.ApiClient, crd_dir: Path, timeout: float = Within.TAKEOVER) -> list[str]:
    """Create or replace every CRD in crd_dir and wait until each is Established."""
    ext = client.ApiextensionsV1Api(api)
    names: list[str] = []
    served_version: dict[str, str] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        body: dict[str, Any] = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        names.append(name)
        served_version[name] = next(v["name"] for v in body["spec"]["versions"] if v.get("served", True))
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(name, body)
    pending = set(names)

    def established() -> bool:
        for name in list(pending):
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])}
            if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True":
                pending.discard(name)
        return not pending

    try:
        eventually(established, timeout, "the CRDs to be established", interval=0.1)
    except TimeoutError:
        raise TimeoutError(f"CRDs not established within {timeout}s: {sorted(pending)}") from None
    # Discovery can lag establishment by a moment; wait until the resources are served.
    custom = client.CustomObjectsApi(api)

    def served(name: str) -> bool:
        plural, group = name.split(".", 1)
        try:
            custom.list_cluster_custom_object(group, served_version[name], plural, limit=1)
        except ApiException as err:
            if err.status != 404:
                raise
            return False
        return True

    for name in names:
        eventually(partial(served, name), timeout, f"{name} to be served", interval=0.1)
    policy = crd_dir.resolve().parent / "charts/durable-agents/files/agentrun-spec-policy.yaml"
    if not policy.is_file():  # the chart's own crds/: the policy is in its files/
        policy = crd_dir.resolve().parent / "files/agentrun-spec-policy.yaml"
    if any(name.startswith("agentruns.") for name in names) and policy.is_file():
        install_spec_policy(api, policy, timeout)
    return names


SPEC_POLICY = "agentrun-spec.durable-agents.io"


def install_spec_policy(api: client.ApiClient, body_file: Path, timeout: float = Within.TAKEOVER) -> None:
    """The ValidatingAdmissionPolicy (and its binding, cluster-wide) that checks the AgentRun
    spec's CEL rules, as the chart makes it (templates/agentrun-spec-policy.yaml), and wait until
    the API server enforces it: a server-side dry run of a run with two kinds in one step is refused."""
    adm = client.AdmissionregistrationV1Api(api)
    spec = yaml.safe_load(body_file.read_text())
    objects: list[tuple[Any, Any, Any, dict[str, Any]]] = [
        (
            adm.create_validating_admission_policy,
            adm.read_validating_admission_policy,
            adm.replace_validating_admission_policy,
            {"metadata": {"name": SPEC_POLICY}, "spec": spec},
        ),
        (
            adm.create_validating_admission_policy_binding,
            adm.read_validating_admission_policy_binding,
            adm.replace_validating_admission_policy_binding,
            {
                "metadata": {"name": SPEC_POLICY},
                "spec": {"policyName": SPEC_POLICY, "validationActions": ["Deny"]},
            },
        ),
    ]
    for create, read, replace, body in objects:
        try:
            create(body)
        except ApiException as err:
            if err.status != 409:
                raise
            body["metadata"]["resourceVersion"] = read(SPEC_POLICY).metadata.resource_version
            replace(SPEC_POLICY, body)
    custom = client.CustomObjectsApi(api)
    probe = {
        "apiVersion": "durable-agents.io/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "spec-policy-probe", "namespace": "default"},
        "spec": {
            "taskType": "probe",
            "objective": "two kinds in one step",
            "steps": [{"name": "both", "complete": {"result": "x"}, "await": {"event": "x"}}],
        },
    }

    def enforced() -> bool:
        try:
            custom.create_namespaced_custom_object(
                "durable-agents.io", "v1alpha1", "default", "agentruns", probe, dry_run="All"
            )
        except ApiException as err:
            if err.status == 422 and "exactly one of" in str(err.body):
                return True
            if err.status in (403, 422, 500) and "webhook" in str(err.body):
                return True  # an admission webhook of a test refused it first: the policy is known
            raise
        return False

    eventually(enforced, timeout, f"the ValidatingAdmissionPolicy {SPEC_POLICY} to be enforced", interval=0.1)
