"""Kubernetes access for the operator: one client, a dedicated thread pool, impersonation.

The official ``kubernetes`` client is synchronous; every call runs on a bounded executor so the
kopf event loop never blocks. Impersonation sends requests as the run's ServiceAccount, so a
run can never do more than its ServiceAccount may (no confused deputy).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException, RESTResponse, contenttype_matches

from durable_agents.shell.ground import fast_json

T = TypeVar("T")

# (namespace, name): how the operator keys a namespaced object in its queues and caches.
ObjectKey = tuple[str, str]

_JSON = "application/json"
_MERGE_PATCH = "application/merge-patch+json"
_OBJECT_PATH = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
_COLLECTION_PATH = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"
# The response types of the generated methods: what a status is deserialized as (a plain object
# for a custom object); a non-2xx status raises ApiException either way.
_GOT: Mapping[str, str | None] = {"200": "object", "401": None}
_REPLACED: Mapping[str, str | None] = {"200": "object", "201": "object", "401": None}
_CREATED: Mapping[str, str | None] = {"200": "object", "201": "object", "202": "object", "401": None}


def _plain_path(params: dict[str, Any]) -> bool:
    return all(type(value) is str for value in params.values())


def _plain_body(body: Any) -> bool:
    """A dict with str keys: what the generated methods' ``Dict[str, Any]`` takes as it is."""
    return type(body) is dict and all(type(key) is str for key in body)


def load_api_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    """In-cluster credentials when running in a Pod, else the kubeconfig (KUBECONFIG or given)."""
    cfg = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


class ImpersonationRefused(Exception):
    """The API server refused the operator the right to act as a ServiceAccount (403 "cannot
    impersonate"): the namespace has not opted in, or opted out. Not an ApiException, so no caller
    takes it for the ServiceAccount's own refusal (a definite failure of the run's request): the
    request was never made; the run waits for its namespace (NamespaceNotManaged)."""

    def __init__(self, namespace: str, message: str) -> None:
        super().__init__(message)
        self.namespace = namespace

    @classmethod
    def of(cls, err: ApiException) -> ImpersonationRefused | None:
        body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
        if err.status != 403 or "cannot impersonate" not in body:
            return None
        found = _REFUSED_IN.search(body)
        return cls(found.group(1) if found else "", body[:500])


_REFUSED_IN = re.compile(r'in the namespace \\?"([a-z0-9-]+)\\?"')


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
        try:
            return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
        except ApiException as err:
            refused = ImpersonationRefused.of(err)
            if refused is not None:
                raise refused from err
            raise

    # --- the hot calls on the operator's own records -------------------------------------------
    # The generated methods validate every argument with pydantic and copy every request body
    # through ``sanitize_for_serialization`` before ``json.dumps``: on the operator's status
    # writes and reads that was a measurable share of its CPU. For the plain arguments they are
    # given here (str names, a dict body) these build the same request (``param_serialize``: path
    # quoting, headers, auth; the same JSON text) and read the answer through the client's own
    # ``response_deserialize`` (the same dict; the same ApiException subclass on non-2xx).
    # Anything else goes to the generated method, which validates (and refuses) it as before.

    def get_namespaced_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> Any:
        """``CustomObjectsApi.get_namespaced_custom_object``."""
        path = {"group": group, "version": version, "namespace": namespace, "plural": plural, "name": name}
        if not _plain_path(path):
            return self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        return self.request_json("GET", _OBJECT_PATH, path, types=_GOT)

    def replace_namespaced_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any]
    ) -> Any:
        """``CustomObjectsApi.replace_namespaced_custom_object_status`` (no Content-Type header: the
        generated method sends none either)."""
        path = {"group": group, "version": version, "namespace": namespace, "plural": plural, "name": name}
        if not _plain_path(path) or not _plain_body(body):
            custom = self.custom
            return custom.replace_namespaced_custom_object_status(
                group, version, namespace, plural, name, body
            )
        return self.request_json("PUT", _OBJECT_PATH + "/status", path, body, types=_REPLACED)

    def merge_patch_namespaced_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any]
    ) -> Any:
        """``CustomObjectsApi.patch_namespaced_custom_object`` as a JSON merge patch."""
        path = {"group": group, "version": version, "namespace": namespace, "plural": plural, "name": name}
        if not _plain_path(path) or not _plain_body(body):
            return self.custom.patch_namespaced_custom_object(
                group, version, namespace, plural, name, body, _content_type=_MERGE_PATCH
            )
        return self.request_json("PATCH", _OBJECT_PATH, path, body, content_type=_MERGE_PATCH, types=_GOT)

    def list_namespaced_objects(self, group: str, version: str, namespace: str, plural: str) -> Any:
        """``CustomObjectsApi.list_namespaced_custom_object`` without options (the webhook lists a
        namespace's AgentPolicies at every run it admits)."""
        path = {"group": group, "version": version, "namespace": namespace, "plural": plural}
        if not _plain_path(path):
            return self.custom.list_namespaced_custom_object(group, version, namespace, plural)
        return self.request_json("GET", _COLLECTION_PATH, path, types=_GOT)

    def create_namespaced_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> Any:
        """``CustomObjectsApi.create_namespaced_custom_object`` (an ActionRecord per effect)."""
        path = {"group": group, "version": version, "namespace": namespace, "plural": plural}
        if not _plain_path(path) or not _plain_body(body):
            return self.custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        return self.request_json("POST", _COLLECTION_PATH, path, body, content_type=_JSON, types=_CREATED)

    def create_event(self, namespace: str, body: dict[str, Any]) -> Any:
        """``CoreV1Api.create_namespaced_event``, answered as a dict (one or more per run)."""
        if type(namespace) is not str or not _plain_body(body):
            return self.core.create_namespaced_event(namespace, body)
        path = {"namespace": namespace}
        return self.request_json(
            "POST", "/api/v1/namespaces/{namespace}/events", path, body, content_type=_JSON, types=_CREATED
        )

    def create_subject_access_review(self, body: dict[str, Any]) -> Any:
        """``AuthorizationV1Api.create_subject_access_review``, answered as a dict (the webhook asks
        one or two per review: the generated method's validation and model were a tenth of its CPU)."""
        return self.request_json(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {},
            body,
            content_type=_JSON,
            types=_CREATED,
        )

    def request_json(
        self,
        method: str,
        resource_path: str,
        path_params: dict[str, str],
        body: dict[str, Any] | None = None,
        *,
        content_type: str | None = None,
        types: Mapping[str, str | None],
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One request with a JSON body (or none), answered as ``response_deserialize`` does with
        the response ``types`` of the generated method it stands for."""
        if content_type is not None and not contenttype_matches(content_type, "application", "json"):
            raise ValueError(f"request_json sends JSON, not {content_type}")
        api = self.api
        sent: dict[str, str] = {**(headers or {}), "Accept": _JSON}
        if content_type is not None:
            sent["Content-Type"] = content_type
        method, url, sent, _, _ = api.param_serialize(
            method=method,
            resource_path=resource_path,
            path_params=path_params,
            header_params=sent,
            auth_settings=["BearerToken"],
        )
        if body is None:
            response = api.rest_client.request(method, url, headers=sent)
        else:
            response = self._send_json(method, url, sent, body)
        response.read()
        if 200 <= response.status <= 299 and types.get(str(response.status)) == "object":
            return fast_json.loads(response.data)  # what ``deserialize(..., "object")`` returns
        return api.response_deserialize(response_data=response, response_types_map=dict(types)).data

    def _send_json(
        self, method: str, url: str, headers: dict[str, str], body: dict[str, Any]
    ) -> RESTResponse:
        """What ``RESTClientObject.request`` does with a JSON body, without the body walk before."""
        payload: bytes | str | None = fast_json.dumps(body)
        if payload is None:  # not plain JSON (a datetime, a model): the client's conversion
            payload = json.dumps(self.api.sanitize_for_serialization(body))
        try:
            raw = self.api.rest_client.pool_manager.request(
                method, url, body=payload, timeout=None, headers=headers, preload_content=False
            )
        except urllib3.exceptions.SSLError as err:
            raise ApiException(status=0, reason=f"{type(err).__name__}\n{err}") from err
        return RESTResponse(raw)

    def get_as(self, api_version: str, kind: str, name: str, namespace: str | None, user: str) -> Any:
        """The object, read as ``user`` (impersonated), as a dict: the dynamic client finds its
        path (discovery, cached), the read itself skips its ``ResourceInstance`` wrapping (a model
        run's reads, issue 38). Unknown kinds raise ``ResourceNotFoundError``, refusals ApiException."""
        resource = self.dynamic().resources.get(api_version=api_version, kind=kind)
        path = resource.path(name=name, namespace=namespace if resource.namespaced else None)
        return self.request_json("GET", path, {}, headers={"Impersonate-User": user}, types=_GOT)

    def dynamic(self) -> dynamic.DynamicClient:
        # Discovery is cached for the life of the process; built lazily on first use.
        if self._dynamic is None:
            self._dynamic = dynamic.DynamicClient(self.api)
        return self._dynamic

    def dedicated(self, name: str, threads: int = 4) -> Kube:
        """A handle on the same API server, as the same user, with its own connections and
        threads: a call made through it never waits behind this handle's calls, however many are
        queued (the Leases that keep this process's ownership must not wait behind run work or a
        burst of Events). The caller closes it."""
        api = client.ApiClient(self.api.configuration)
        api.default_headers.update(self.api.default_headers)
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"kube-{name}")
        return Kube(api, pool)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.api.close()


def is_status(err: BaseException, *codes: int) -> bool:
    return isinstance(err, ApiException) and err.status in codes
