"""Secret and ConfigMap keys a run names, read AS THE RUN'S ServiceAccount, by impersonation.

One path for every credential a run uses: the model endpoint's API key, the system prompt, an MCP
server's bearer token, headers and CA bundle. A run can only use what its own account may read,
never what only the operator may. A value read here is never logged, put on a span, an Event or a
status: errors name the object, the key and the account, never the value.
"""

from __future__ import annotations

import base64

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import KeyReference, McpServer
from durable_agents.shell.agent.mcp_tools import McpAccess
from durable_agents.shell.ground.kube import Kube, service_account_user


class Unresolvable(Exception):
    """An input the run names cannot be used, and will not become usable by retrying soon."""


async def read_key(kube: Kube, namespace: str, service_account: str, kind: str, ref: KeyReference) -> str:
    """One key of a ConfigMap or Secret in ``namespace``, read as ``service_account``.

    Raises :class:`Unresolvable` (naming the object and the account) when the account may not
    read it, it does not exist or has no such key; a Secret's value must be printable ASCII (it is
    sent in an HTTP header). Any other API error is raised as is (retried with backoff).
    """
    if kind not in ("ConfigMap", "Secret"):
        raise ValueError(f"read_key reads a ConfigMap or a Secret, not a {kind}")
    user = service_account_user(namespace, service_account)
    try:
        obj = await kube.call(kube.get_as, "v1", kind, ref.name, namespace, user)
    except ApiException as err:
        if err.status == 403:
            raise Unresolvable(
                f"ServiceAccount {namespace}/{service_account} may not read {kind} {namespace}/{ref.name}"
            ) from err
        if err.status == 404:
            raise Unresolvable(f"{kind} {namespace}/{ref.name} not found") from err
        raise
    data: dict[str, str] = obj.get("data") or {}
    if ref.key not in data:
        raise Unresolvable(f"{kind} {namespace}/{ref.name} has no key {ref.key!r}")
    if kind == "Secret":
        return header_value(base64.b64decode(data[ref.key]), f"Secret {namespace}/{ref.name} key {ref.key!r}")
    return data[ref.key]


def header_value(raw: bytes, where: str) -> str:
    """A Secret's value as an HTTP header carries it: printable ASCII (anything else made the HTTP
    client raise before a byte was sent: an internal error, not a reason)."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise Unresolvable(f"{where} is not printable ASCII, so it cannot be sent in a header") from None
    if not text.isprintable():
        raise Unresolvable(f"{where} is not printable ASCII, so it cannot be sent in a header")
    return text


async def mcp_access(kube: Kube, namespace: str, service_account: str, server: McpServer) -> McpAccess:
    """The headers and CA bundle for requests to ``server``, read now (a rotated Secret is seen by
    the next request). Raises :class:`Unresolvable` naming the Secret or ConfigMap and the account."""
    headers: dict[str, str] = {}
    for header in server.headers:
        headers[header.name] = await read_key(
            kube, namespace, service_account, "Secret", header.secret_key_ref
        )
    if server.bearer_token_secret_ref is not None:
        if any(name.lower() == "authorization" for name in headers):
            raise Unresolvable(
                f"MCP server {server.name!r} sets both bearerTokenSecretRef and an Authorization header"
            )
        token = await read_key(kube, namespace, service_account, "Secret", server.bearer_token_secret_ref)
        headers["Authorization"] = f"Bearer {token}"
    ca = server.tls.ca_config_map_ref if server.tls is not None else None
    ca_pem = await read_key(kube, namespace, service_account, "ConfigMap", ca) if ca is not None else None
    return McpAccess(headers=headers, ca_pem=ca_pem)
