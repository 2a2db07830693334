"""Effect arguments given by reference to a Secret in the run's namespace.

Anywhere in an effect's arguments, an object of exactly this shape is a reference::

    {"valueFrom": {"secretKeyRef": {"name": "payment-token", "key": "token"}}}

The dispatcher reads the Secret right before the send, as the run's ServiceAccount (so a run can
only use what its ServiceAccount may read), puts the value (UTF-8 text) in the arguments it hands
to the effect, and records which Secret version it read with a digest keyed by the run's data key
in the ActionRecord's ``status.resolvedReferences``. The value itself is never stored: not in the
run, the checkpoint, the ActionRecord or an Event. A reference that cannot be read (no such
Secret or key, or the ServiceAccount may not read it) fails the action before anything is sent.

Approval digests cover the reference (name and key), not the Secret's content.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import ResolvedReference
from durable_agents.core.sealed_values import DataKey, keyed_digest
from durable_agents.shell.effects.base import Action, EffectContext
from durable_agents.shell.ground.kube import service_account_user

SECRET_REFERENCE_UNRESOLVED = "SecretReferenceUnresolved"
_MAX_DEPTH = 32

Path = tuple[str | int, ...]


class UnresolvedReference(Exception):
    """A reference the run's ServiceAccount cannot read: nothing is sent."""


def _reference(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, Mapping) or set(value) != {"valueFrom"}:
        return None
    source = value["valueFrom"]
    if not isinstance(source, Mapping) or set(source) != {"secretKeyRef"}:
        return None
    ref = source["secretKeyRef"]
    if (
        not isinstance(ref, Mapping)
        or not isinstance(ref.get("name"), str)
        or not isinstance(ref.get("key"), str)
    ):
        return None
    return ref["name"], ref["key"]


def find_references(value: Any, path: Path = ()) -> Iterator[tuple[Path, str, str]]:
    """(path, Secret name, key) of every reference in ``value``, depth-first."""
    if len(path) > _MAX_DEPTH:
        return
    found = _reference(value)
    if found is not None:
        yield path, *found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from find_references(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from find_references(item, (*path, index))


def _replaced(value: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, Mapping):
        return {**value, head: _replaced(value[head], rest, new)}
    items = list(value)
    items[int(head)] = _replaced(items[int(head)], rest, new)
    return items


def dotted(path: Path) -> str:
    return ".".join(str(part) for part in path) or "(arguments)"


async def _read(ctx: EffectContext, name: str, key: str) -> tuple[str, str | None]:
    user = service_account_user(ctx.namespace, ctx.service_account)

    def get() -> dict[str, Any]:
        dyn = ctx.kube.dynamic()
        secrets = dyn.resources.get(api_version="v1", kind="Secret")
        found: dict[str, Any] = dyn.get(
            secrets, name=name, namespace=ctx.namespace, header_params={"Impersonate-User": user}
        ).to_dict()
        return found

    try:
        secret = await ctx.kube.call(get)
    except ApiException as err:
        why = {403: "may not read it", 404: "it does not exist"}.get(err.status, f"HTTP {err.status}")
        raise UnresolvedReference(
            f"Secret {name!r} as ServiceAccount {ctx.service_account!r}: {why}"
        ) from err
    data = secret.get("data") or {}
    if key not in data:
        raise UnresolvedReference(f"Secret {name!r} has no key {key!r}")
    try:
        text = base64.b64decode(data[key], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as err:
        raise UnresolvedReference(f"Secret {name!r} key {key!r} is not UTF-8 text") from err
    version = (secret.get("metadata") or {}).get("resourceVersion")
    return text, str(version) if version is not None else None


async def resolve_references(
    ctx: EffectContext, action: Action, data_key: DataKey | None
) -> tuple[Action, list[ResolvedReference]]:
    """The action with every reference replaced by the Secret's value, and what was read."""
    arguments: Any = action.arguments
    resolved: list[ResolvedReference] = []
    for path, name, key in list(find_references(action.arguments)):
        value, version = await _read(ctx, name, key)
        arguments = _replaced(arguments, path, value)
        digest = keyed_digest(data_key, f"references/{dotted(path)}", value) if data_key else None
        resolved.append(
            ResolvedReference(
                path=dotted(path), secret=name, key=key, resource_version=version, digest=digest
            )
        )
    return Action(action.key, action.target, arguments), resolved
