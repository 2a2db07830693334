"""AgentRuns as a test drives them: create, read, patch, wait for a state, list Leases and Events."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import admitted, sealed

STAMPED_REQUESTS = frozenset({"approvals", "cancellations", "retryQuarantine"})


def _merged(old: Any, patch: Any) -> Any:
    """A JSON merge patch's result for one field (maps merge, anything else replaces)."""
    if isinstance(old, dict) and isinstance(patch, dict):
        return {**old, **patch}
    return patch


class Runs:
    """AgentRuns in one namespace, as a test drives them."""

    def __init__(self, kube: KubeEnv, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.custom = kube.custom()

    def create(
        self, spec: dict[str, Any], name: str | None = None, *, stamped: bool = True, seal: bool = True
    ) -> str:
        """Create a run; ``stamped``: as through the admission webhook (see :mod:`.keys`), which
        also seals its values unless ``seal`` is False (an operator release from before sealing)."""
        name = name or f"run-{uuid.uuid4().hex[:8]}"
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        if stamped and "createdBy" not in spec:
            body["spec"] = {**spec, **admitted("CREATE", body, None)}
            if seal:
                body = sealed("CREATE", body, None)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "agentruns", body)
        return name

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentruns", name
        )
        return out

    def all(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentruns"
        )["items"]
        return items

    def state(self, name: str) -> str:
        return str((self.get(name).get("status") or {}).get("state", ""))

    def patch_spec(self, name: str, spec: dict[str, Any], *, stamped: bool = True) -> None:
        """Merge-patch the spec; ``stamped``: new requests (decisions, cancellations, a quarantine
        retry) stamped as through the admission webhook (see :mod:`.keys`)."""
        if stamped and STAMPED_REQUESTS & spec.keys():
            old = self.get(name)
            new = {
                **old,
                "spec": {**old["spec"], **{k: _merged(old["spec"].get(k), v) for k, v in spec.items()}},
            }
            spec = {**spec, **admitted("UPDATE", new, old)}
        if stamped and {"answers", "events"} & spec.keys():
            old = self.get(name)
            new = {
                **old,
                "spec": {**old["spec"], **{k: _merged(old["spec"].get(k), v) for k, v in spec.items()}},
            }
            spec = {**spec, **{k: v for k, v in sealed("UPDATE", new, old)["spec"].items() if k in spec}}
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentruns", name, {"spec": spec}
        )

    def wait_state(self, name: str, *states: str, timeout: float = Within.TAKEOVER) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            try:
                run = self.get(name)
            except client.ApiException as err:
                if err.status == 404:  # not created yet (a child run, say): keep waiting
                    return None
                raise
            return run if (run.get("status") or {}).get("state") in states else None

        try:
            return eventually(reached, timeout, f"run {name} to reach {states}", interval=0.1)
        except TimeoutError as err:
            try:
                status = self.get(name).get("status") or {}
            except client.ApiException as api_err:
                raise TimeoutError(f"{err}; it does not exist ({api_err.status})") from None
            raise TimeoutError(
                f"{err}; it is {status.get('state')!r} at v{status.get('stateVersion')}"
            ) from None

    def through_webhook(self) -> bool:
        """Whether writes to runs here pass through the operator's admission webhook now: a dry-run
        create comes back stamped (and no webhook answers for an operator gone since)."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "metadata": {"name": f"webhook-probe-{uuid.uuid4().hex[:8]}"},
            "spec": {"taskType": "probe", "objective": "probe", "steps": [{"name": "done", "complete": {}}]},
        }
        try:
            made = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "agentruns", body, dry_run="All"
            )
        except client.ApiException:
            return False
        return bool(((made.get("spec") or {}).get("createdBy") or {}).get("stamp"))

    def await_webhook(self, within: float = Within.COMMIT) -> None:
        """Wait until writes pass through the admission webhook of the operator just started. The
        API server learns of a webhook configuration (and of a new address in it) through a watch:
        right after the operator installs it, a write may still skip the webhook, or go to the
        address of an operator stopped since (refused: failed calling webhook)."""
        eventually(self.through_webhook, within, f"writes in {self.namespace} to pass through the webhook")

    def leases(self) -> list[Any]:
        """Per-run Leases (``agentrun-<run>``, labelled with the run): an earlier release made
        them on every unit of work; this one never does (its runs are covered by shard Leases)."""
        return list(
            client.CoordinationV1Api(self.kube.api)
            .list_namespaced_lease(self.namespace, label_selector="durable-agents.io/run")
            .items
        )

    def wait_event(self, name: str, reason: str, within: Within | float = Within.COMMIT) -> list[Any]:
        """The Events of reason about name, awaited: the operator tells an Event after the write it
        reports, so a test that saw the write may read the Events before the Event exists."""
        return eventually(
            lambda: [e for e in self.events(name) if e.reason == reason] or None,
            within,
            f"a {reason} Event about {name}",
        )

    def shard_leases(self) -> list[Any]:
        """The region's shard Leases in this namespace (where the tests' operators keep them)."""
        return list(
            client.CoordinationV1Api(self.kube.api)
            .list_namespaced_lease(self.namespace, label_selector="durable-agents.io/lease-kind=shard")
            .items
        )

    def drop_shard_leases_of(self, holder: str) -> int:
        """Delete the shard Leases that still name ``holder``, a process that has exited (a release
        refused by a race is left to expire); how many. The next process then acquires fresh
        Leases instead of taking them over, which would fence each run first (one more write)."""
        api = client.CoordinationV1Api(self.kube.api)
        stale = [lease for lease in self.shard_leases() if lease.spec.holder_identity == holder]
        for lease in stale:
            api.delete_namespaced_lease(lease.metadata.name, self.namespace)
        return len(stale)

    def events(self, name: str) -> list[Any]:
        return list(
            client.CoreV1Api(self.kube.api)
            .list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
            .items
        )


def read_ask_await_complete(configmap: str, *, answered: bool = False, expires: str = "1h") -> dict[str, Any]:
    """The canonical read-only scenario: read, ask, wait for an event, complete."""
    spec: dict[str, Any] = {
        "taskType": "e2e",
        "objective": "read a config map, confirm with a human, wait for a window, finish",
        "steps": [
            {
                "name": "read-settings",
                "read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": configmap}},
            },
            {"name": "confirm", "ask": {"question": "proceed?", "expiresIn": expires}},
            {"name": "window", "await": {"event": "window-open", "expiresIn": expires}},
            {"name": "done", "complete": {"result": "ok"}},
        ],
    }
    if answered:
        spec["answers"] = {"confirm": "yes"}
        spec["events"] = {"window-open": "now"}
    return spec


# The transitions of read_ask_await_complete, in order.
EXPECTED_EVENTS = [
    "accepted",
    "step_completed",
    "input_requested",
    "input_received",
    "revalidated",
    "external_awaited",
    "external_received",
    "revalidated",
    "succeeded",
]


def assert_history_is_gapless(run: dict[str, Any]) -> list[dict[str, Any]]:
    history = run["status"]["history"]
    versions = [h["stateVersion"] for h in history]
    assert versions == list(range(1, len(history) + 1)), f"state versions must grow by one: {versions}"
    assert run["status"]["stateVersion"] == len(history)
    assert run["status"]["checkpoint"]["position"]["stateVersion"] == len(history)
    return list(history)


def assert_one_holder_at_a_time(run: dict[str, Any]) -> set[str]:
    """Each fencing epoch in the run's history names one holder, and epochs never go back: no two
    holders advanced the run at once. Returns the holders seen."""
    pairs = [(h["holder"], h["epoch"]) for h in run["status"]["history"]]
    per_epoch: dict[int, set[str]] = {}
    for holder, epoch in pairs:
        per_epoch.setdefault(epoch, set()).add(holder)
    name = run["metadata"]["name"]
    assert all(len(v) == 1 for v in per_epoch.values()), f"{name}: two holders in one epoch: {pairs}"
    epochs = [epoch for _, epoch in pairs]
    assert epochs == sorted(epochs), f"{name}: an epoch went back: {pairs}"
    return {holder for holder, _ in pairs}


def written_by_clients(obj: dict[str, Any]) -> dict[str, Any]:
    """What clients wrote of an object: all but its status, its resourceVersion and the status
    subresource's managedFields entries. The operator writes an AgentPolicy's status on its own
    pace; a write of the object itself (spec, labels, annotations, a field manager) still shows."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    meta["managedFields"] = [
        {k: v for k, v in m.items() if k != "time"}
        for m in meta.get("managedFields") or []
        if m.get("subresource") != "status"
    ]
    return {k: v for k, v in obj.items() if k != "status"} | {"metadata": meta}
