"""A stale backup: export a namespace's AgentRuns and ActionRecords, restore them elsewhere."""

from __future__ import annotations

from typing import Any

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv

PLURALS = ("agentruns", "actionrecords")
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink")

Backup = dict[str, list[dict[str, Any]]]


def export_objects(kube: KubeEnv, namespace: str) -> Backup:
    """What a backup tool stores: every AgentRun and ActionRecord of the namespace, with status."""
    custom = kube.custom()
    return {
        plural: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
        for plural in PLURALS
    }


def restore_objects(kube: KubeEnv, namespace: str, backup: Backup) -> int:
    """Restore a backup as a restore tool does: create each object (the API server assigns new UIDs
    and resourceVersions), then write its status through the status subresource."""
    custom = kube.custom()
    restored = 0
    for plural in PLURALS:
        for obj in backup[plural]:
            meta = {k: v for k, v in obj["metadata"].items() if k not in _SERVER_FIELDS}
            meta["namespace"] = namespace
            body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta}
            body["spec"] = obj["spec"]
            created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
            if obj.get("status"):
                created["status"] = obj["status"]
                custom.replace_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, plural, meta["name"], created
                )
            restored += 1
    return restored
