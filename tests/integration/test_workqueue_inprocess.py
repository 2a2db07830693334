"""The work queue (shell/ground/workqueue.py) in the test's own event loop, against the real API
server: each key to one task at a time, and a key added while it is processed processed once more.
The run worker's and the dispatcher's queues are this one (tests/integration/test_worker_inprocess.py
drives them through the worker and the dispatcher)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.workqueue import WorkQueue
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually_async


async def test_the_queue_gives_each_key_to_one_task_at_a_time(kube: KubeEnv, namespace: str) -> None:
    """Three ConfigMaps, each a counter advanced by read, read again, write with the read's
    resourceVersion: two tasks on one key at once would make one write fail (409). The queue has
    twice as many tasks as keys, so an idle task is always there to take a key a second time. A
    key added again while it is processed is processed once more afterwards, however often it
    was added."""
    api = Kube(kube.api)
    core = client.CoreV1Api(kube.api)
    names = ["a", "b", "c"]
    for name in names:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"n": "0"}})
    in_flight: Counter[ObjectKey] = Counter()
    peak: Counter[ObjectKey] = Counter()
    passes: Counter[ObjectKey] = Counter()
    failures: list[str] = []
    together = asyncio.Event()  # set once every key is in flight at the same time
    queue: WorkQueue

    async def process(key: ObjectKey, _: dict[str, Any] | None) -> None:
        in_flight[key] += 1
        peak[key] = max(peak[key], in_flight[key])
        passes[key] += 1
        try:
            if passes[key] == 1:
                for _ in range(5):
                    queue.add(key)  # while it is processed: one more pass afterwards, not five
                # The first passes wait for each other: three tasks really do run at once.
                if len(queue.active) == len(names):
                    together.set()
                await asyncio.wait_for(together.wait(), Within.COMMIT)
            namespace_, name = key
            await api.call(core.read_namespaced_config_map, name, namespace_)
            counter = await api.call(core.read_namespaced_config_map, name, namespace_)
            counter.data["n"] = str(int(counter.data["n"]) + 1)
            await api.call(core.replace_namespaced_config_map, name, namespace_, counter)
        except ApiException as err:
            failures.append(f"{key}: {err.status}")
            raise
        finally:
            in_flight[key] -= 1

    queue = WorkQueue("test", process, concurrency=2 * len(names))  # idle tasks to spare
    queue.start()
    try:
        keys = [(namespace, name) for name in names]
        for key in keys:
            queue.add(key)

        async def drained() -> bool:
            return queue.idle and sum(passes.values()) == 2 * len(names)

        await eventually_async(drained, Within.COMMIT, "every key processed twice, then an idle queue")
    finally:
        await queue.stop()
        api.executor.shutdown(wait=False, cancel_futures=True)
    assert failures == [], "a write raced another task on the same key"
    assert peak == {key: 1 for key in keys}, "a key was given to two tasks at once"
    assert passes == {key: 2 for key in keys}, "re-added while processed: exactly one more pass"
    stored = {name: core.read_namespaced_config_map(name, namespace).data["n"] for name in names}
    assert stored == {name: "2" for name in names}, "every pass wrote once, none was lost"
