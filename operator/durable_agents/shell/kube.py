"""Kubernetes access for the operator: one client, a dedicated thread pool, impersonation.

The official ``kubernetes`` client is synchronous; every call runs on a bounded executor so the
kopf event loop never blocks. Impersonation sends requests as the run's ServiceAccount, so a
run can never do more than its ServiceAccount may (no confused deputy).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException

T = TypeVar("T")

GROUP = "durable-agents.io"
VERSION = "v1alpha1"
# (namespace, name): how the operator keys a namespaced object in its queues and caches.
ObjectKey = tuple[str, str]


def load_api_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    """In-cluster credentials when running in a Pod, else the kubeconfig (KUBECONFIG or given)."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@dataclass
class Kube:
    """The operator's handle on the API server."""

    api: client.ApiClient
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=32, thread_name_prefix="kube")
    )
    _dynamic: dynamic.DynamicClient | None = None

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def dynamic(self) -> dynamic.DynamicClient:
        # Discovery is cached for the life of the process; built lazily on first use.
        if self._dynamic is None:
            self._dynamic = dynamic.DynamicClient(self.api)
        return self._dynamic

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.api.close()


def is_status(err: BaseException, *codes: int) -> bool:
    return isinstance(err, ApiException) and err.status in codes
