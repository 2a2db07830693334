"""The AgentRun reflector on a real API server: list, then watch, in order, and recover from an
expired resourceVersion by listing again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tests.integration.test_run_leases import agent_run

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.intake.reflector import RunReflector
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async

Seen = list[tuple[str | None, str, str]]


def recorder() -> tuple[Seen, Any]:
    seen: Seen = []

    def deliver(kind: str | None, obj: dict[str, Any]) -> None:
        seen.append((kind, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    return seen, deliver


def polled(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A plain condition as the predicate of :func:`eventually_async` (the reflector runs on this
    event loop: the wait must not block it)."""

    async def holds() -> bool:
        return condition()

    return holds


async def test_lists_in_pages_then_watches_every_change_in_order(kube: KubeEnv, namespace: str) -> None:
    for i in range(5):
        agent_run(kube, namespace, f"before-{i}")
    seen, deliver = recorder()
    reflector = RunReflector(Kube(kube.api), deliver, namespace=namespace, page_size=2)
    reflector.start()
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        assert sorted(name for kind, name, _ in seen if kind is None) == [f"before-{i}" for i in range(5)]
        custom = kube.custom()
        agent_run(kube, namespace, "after")
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentruns", "after", {"spec": {"answers": {"confirm": "yes"}}}
        )
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", "before-0")
        await eventually_async(
            polled(lambda: len(seen) >= 8), Within.COMMIT, "the watch to deliver three changes", interval=0.02
        )
        assert [(kind, name) for kind, name, _ in seen[5:]] == [
            ("ADDED", "after"),
            ("MODIFIED", "after"),
            ("DELETED", "before-0"),
        ]
        versions = [int(rv) for _, _, rv in seen[5:]]
        assert versions == sorted(versions), "delivered in the order the API server sent them"
        assert reflector.lists == 1
    finally:
        await asyncio.wait_for(reflector.stop(), 10)  # a watch blocked on its socket still stops


async def test_an_expired_resource_version_lists_again_and_loses_nothing(
    kube: KubeEnv, namespace: str
) -> None:
    agent_run(kube, namespace, "existing")
    seen, deliver = recorder()
    reflector = RunReflector(Kube(kube.api), deliver, namespace=namespace)
    reflector._version = "1"  # as if resuming long after the history was compacted: 410 Gone
    reflector.start()
    try:
        await eventually_async(
            polled(lambda: reflector.lists >= 1),
            Within.COMMIT,
            "the reflector to list again after 410 Gone",
            interval=0.02,
        )
        assert "existing" in {name for kind, name, _ in seen if kind is None}, seen
        agent_run(kube, namespace, "later")
        await eventually_async(
            polled(lambda: any(name == "later" for _, name, _ in seen)),
            Within.COMMIT,
            "the resumed watch",
            interval=0.02,
        )
    finally:
        await asyncio.wait_for(reflector.stop(), 10)


async def test_runs_are_delivered_without_their_managed_fields(kube: KubeEnv, namespace: str) -> None:
    """No subscriber reads managed fields, and every one would hold them while a run is queued or
    kept (about half of a parked run's bytes): they are dropped before delivery, listed or watched."""
    stored = agent_run(kube, namespace, "listed")
    assert stored["metadata"].get("managedFields"), "the API server keeps them"
    bodies: list[tuple[str | None, dict[str, Any]]] = []
    reflector = RunReflector(
        Kube(kube.api), lambda kind, obj: bodies.append((kind, obj)), namespace=namespace
    )
    reflector.start()
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        agent_run(kube, namespace, "watched")
        await eventually_async(
            polled(lambda: any(kind == "ADDED" for kind, _ in bodies)),
            Within.COMMIT,
            "the watch",
            interval=0.02,
        )
        assert [kind for kind, _ in bodies] == [None, "ADDED"]
        for _, obj in bodies:
            assert "managedFields" not in obj["metadata"]
            assert obj["metadata"]["namespace"] == namespace
            assert obj["metadata"]["resourceVersion"]
            assert obj["spec"] == stored["spec"]
    finally:
        await asyncio.wait_for(reflector.stop(), 10)
