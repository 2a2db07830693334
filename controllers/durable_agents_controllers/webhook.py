"""The admission webhook served by the operator: identity and stamps, append-only requests, and
the authority of every request (the rules: :mod:`durable_agents.shell.admission.authority`; for
RegionFailovers, :mod:`durable_agents.shell.admission.failover`).

Served only when the configuration gives it a port, from a process of its own that the operator
starts and supervises (:mod:`.webhook_supervisor`, :mod:`.webhook_process`): its own interpreter,
so the worker's long work on a large run (which holds the operator's interpreter lock for seconds)
never delays an answer. It stamps with the operator's keyring (the same keys, read from the same
configuration), which is what the engine verifies. The operator makes its own TLS certificate,
the webhook process serves it on the configured host, and the operator registers
Mutating/ValidatingWebhookConfigurations with failurePolicy Fail: with the webhook down, requests
are refused, never silently accepted.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp.web
import kopf
from kopf._core.engines.admission import AmbiguousResourceError, UnknownResourceError, WebhookError
from pydantic import ValidationError

from durable_agents.api.v1alpha1 import FAILOVER_PLURAL, GROUP, VERSION, AgentRunSpec, Identity
from durable_agents.core import limits, request_stamps
from durable_agents.core.agent.mcp_questions import admission_refusal
from durable_agents.core.retention import FINALIZER
from durable_agents.core.schedule_authority import vouched_creator
from durable_agents.core.sealing import Keyring
from durable_agents.core.sealing_admission import SealingRefused, sealing_changes
from durable_agents.shell.admission import authority as admission
from durable_agents.shell.admission import failover as failover_admission
from durable_agents.shell.admission import registration
from durable_agents.shell.admission.destinations import check_run_destinations
from durable_agents.shell.ground import fast_json
from durable_agents_controllers.manager import Manager
from durable_agents_controllers.reveal import reveal_hook
from durable_agents_controllers.webhook_serving import WebhookServing
from durable_agents_controllers.webhook_supervisor import WebhookProcess

log = logging.getLogger(__name__)
# An UPDATE's review carries the object and the old object, each up to etcd's 1.5 MiB: aiohttp's
# default (1 MiB) answered 413 to answering or cancelling a large run.
MAX_REVIEW_BYTES = 32 * 1024 * 1024
# The API server forwards documents nested up to 10 000 levels; json.loads needs the stack for them
# (raised only while parsing), then limits.refusal walks them without recursion.
_PARSE_RECURSION = 25_000


def invalid_spec(err: ValidationError) -> str:
    """A refusal naming the field pydantic could not take (the first of them)."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in ("spec", *first.get("loc", ())))
    return f"{where}: {first.get('msg', 'invalid')}"


async def home_region(manager: Manager, body: dict[str, Any]) -> str:
    """A new run's home region when it names none: its AgentPolicy's ``defaultRegion``, else the
    region this operator serves. A policy the webhook process's cache has not yet is read, not
    cached (the cache is its policy watch's)."""
    policies = manager.policies
    key = policies.governing_key(body)  # named, else the namespace's default, else the baseline
    if key is not None:
        policy = policies.get(key)
        if policy is None:
            policy = await policies.read(*key)
        if policy is not None and policy.default_region:
            return policy.default_region
    return manager.config.region


async def serve(manager: Manager, settings: kopf.OperatorSettings) -> None:
    """A start hook of the operator's manager: the serving files and the webhook configurations,
    then the webhook process (started and supervised as one of the manager's parts)."""
    del settings  # kopf serves no admission in the operator's process
    serving = WebhookServing(manager)
    configurations = await serving.configure()
    # Installed before the server listens: until then every AgentRun write fails closed.
    await registration.install_webhooks(manager.kube, *configurations)
    if serving.certificates is not None:  # in a cluster: renewed, reloaded, kept current
        manager.runnables.add(serving)
    manager.runnables.add(WebhookProcess(manager.config, serving.directory, manager.webhook_serving))


class Admission:
    """The admission handlers (in the webhook process), with what they need from its manager: the
    Kubernetes client, the keyring and the policy cache (read only: a review never enqueues a run)."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    async def stamp_identity(
        self, body: kopf.Body, userinfo: kopf.UserInfo, patch: kopf.Patch, **kwargs: Any
    ) -> None:
        # The review's size and shape limits were checked before kopf saw it (LimitedWebhookServer).
        manager, operation, old = self.manager, str(kwargs.get("operation")), kwargs.get("old")
        user, keyring = request_stamps.identity_of(dict(userinfo)), manager.keyring
        previous = dict(old) if old is not None else None
        now = datetime.now(UTC)
        stamped = request_stamps.stamps(operation, dict(body), previous, user, now, keyring)
        if operation == "CREATE" and vouched_creator(dict(body), user, keyring, now):
            stamped.pop("createdBy", None)  # a schedule's run: its creator, stamped by the operator
        for field, value in stamped.items():
            patch.spec[field] = value
        if operation == "CREATE" and not (body.get("spec") or {}).get("region"):
            patch.spec["region"] = await home_region(manager, dict(body))
        # An answer to an MCP server's question must answer its requested schema (before sealing).
        refused = admission_refusal(dict(body), previous, keyring) if operation == "UPDATE" else None
        if refused is not None:
            raise kopf.AdmissionError(refused, code=422)
        try:  # then seal what people wrote (the data-key annotation: sealing_admission)
            sealed = sealing_changes(operation, dict(body), previous, keyring, entropy=os.urandom)
        except SealingRefused as err:
            raise kopf.AdmissionError(str(err), code=422) from err
        except ValueError as err:  # a value sealing cannot bind (say, a key with a NUL in it)
            raise kopf.AdmissionError(f"spec: {err}", code=422) from err
        for field, value in sealed.spec.items():
            patch.spec[field] = value
        for key, annotation in sealed.annotations.items():
            patch.metadata.setdefault("annotations", {})[key] = annotation
        finalizers = list(body.metadata.get("finalizers") or [])
        if operation == "CREATE" and FINALIZER not in finalizers:
            # Deleting a live run cancels it first (shell/runs/retention.py): on from the start, so
            # no later write adds it.
            patch.metadata["finalizers"] = [*finalizers, FINALIZER]
        # An approver's dry-run reveal request is answered here (durable_agents.shell.runs.reveal).
        await reveal_hook(manager, body, old, userinfo, bool(kwargs.get("dryrun")), patch)

    async def check_approvals(self, body: kopf.Body, userinfo: kopf.UserInfo, **kwargs: Any) -> None:
        operation, old = str(kwargs.get("operation")), kwargs.get("old")  # limits: as above
        new, user, keyring = dict(body), request_stamps.identity_of(dict(userinfo)), self.manager.keyring
        try:
            reason = await self._checked(operation, new, old, user, keyring)
        except ValidationError as err:  # what the schema let through and the model does not
            raise kopf.AdmissionError(invalid_spec(err), code=422) from err
        if reason is not None:
            raise kopf.AdmissionError(reason, code=403)

    async def _checked(
        self, operation: str, new: dict[str, Any], old: Any, user: Identity, keyring: Keyring
    ) -> str | None:
        kube = self.manager.kube
        if operation == "CREATE":
            refused = await admission.check_create(kube, new, user, keyring)
            return refused or await check_run_destinations(new, self.manager.policies)
        if operation != "UPDATE":
            return None
        spec = AgentRunSpec.model_validate(new.get("spec") or {})
        namespace = (new.get("metadata") or {}).get("namespace") or ""
        status = (old or {}).get("status") or {}
        policy = self.manager.policies.governing_spec(namespace, spec, status)  # named or default
        previous = dict(old) if old is not None else None
        return await admission.check_update(kube, new, previous, user, policy, keyring)

    async def stamp_failover(
        self, body: kopf.Body, userinfo: kopf.UserInfo, patch: kopf.Patch, **kwargs: Any
    ) -> None:
        user = request_stamps.identity_of(dict(userinfo))
        stamped = failover_admission.failover_stamps(
            str(kwargs.get("operation")), dict(body), user, datetime.now(UTC), self.manager.keyring
        )
        for field, value in stamped.items():
            patch.spec[field] = value

    async def check_failover(self, body: kopf.Body, userinfo: kopf.UserInfo, **kwargs: Any) -> None:
        operation, old = str(kwargs.get("operation")), kwargs.get("old")
        user, keyring = request_stamps.identity_of(dict(userinfo)), self.manager.keyring
        previous = dict(old) if old is not None else None
        try:
            reason = await failover_admission.check_failover(
                self.manager.kube, operation, dict(body), previous, user, keyring
            )
        except ValidationError as err:
            raise kopf.AdmissionError(invalid_spec(err), code=422) from err
        if reason is not None:
            raise kopf.AdmissionError(reason, code=403)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """Serve the admission webhook if the configuration enables it: in the operator's process,
    only its files, configurations and process (its handlers: :func:`register_handlers`)."""
    del registry
    if manager.config.webhook_port is not None:
        manager.start_hooks.append(lambda settings: serve(manager, settings))


def register_handlers(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """The AgentRun and RegionFailover admission handlers, on the webhook process's registry."""
    handlers = Admission(manager)
    for plural, path, handler, decorator in (
        ("agentruns", admission.MUTATE_PATH, handlers.stamp_identity, kopf.on.mutate),
        ("agentruns", admission.VALIDATE_PATH, handlers.check_approvals, kopf.on.validate),
        (FAILOVER_PLURAL, failover_admission.MUTATE_FAILOVER_PATH, handlers.stamp_failover, kopf.on.mutate),
        (
            FAILOVER_PLURAL,
            failover_admission.VALIDATE_FAILOVER_PATH,
            handlers.check_failover,
            kopf.on.validate,
        ),
    ):
        decorator(GROUP, VERSION, plural, id=path, operations=["CREATE", "UPDATE"], registry=registry)(
            handler
        )


def _parse(text: str) -> Any:
    try:
        return fast_json.loads(text)  # a review is the object twice: json took a fifth of the webhook
    except RecursionError:
        previous = sys.getrecursionlimit()
        sys.setrecursionlimit(max(previous, _PARSE_RECURSION))
        try:
            return json.loads(text)
        finally:
            sys.setrecursionlimit(previous)


def _dumps(answer: Any) -> str:
    written = fast_json.dumps(answer)  # None: an integer past 64 bits in a patch; json writes it
    return written.decode() if written is not None else json.dumps(answer)


def _denial(review: dict[str, Any], refused: limits.LimitExceeded) -> dict[str, Any]:
    request = review.get("request") or {}
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": review.get("kind", "AdmissionReview"),
        "response": {
            "uid": request.get("uid", ""),
            "allowed": False,
            "status": {"code": 422, "reason": "Invalid", "message": str(refused)},
        },
    }


Observe = Callable[[str, bool, float], None]
"""Told of each review answered: the resource's plural, allowed or not, seconds it took."""


class LimitedWebhookServer(kopf.WebhookServer):
    """kopf's server with room for large reviews, the limits checked before kopf (which diffs old
    and new recursively) or any handler sees the object, and each review parsed once."""

    observe: Observe | None = None  # the webhook process's metrics

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        started = time.perf_counter()
        request = request.clone(client_max_size=MAX_REVIEW_BYTES)
        try:
            review = _parse(await request.text())
        except (RecursionError, json.JSONDecodeError) as err:
            raise aiohttp.web.HTTPBadRequest(reason=f"not an admission review: {type(err).__name__}") from err
        payload = review.get("request") if isinstance(review, dict) else None
        resource = payload.get("resource") if isinstance(payload, dict) else None
        plural = resource.get("resource") if isinstance(resource, dict) else None
        refused = _refused(payload, plural)
        answer = _denial(review, refused) if refused is not None else await _answer(fn, review, request)
        if self.observe is not None:
            allowed = bool((answer.get("response") or {}).get("allowed"))
            self.observe(str(plural), allowed, time.perf_counter() - started)
        return aiohttp.web.json_response(answer, dumps=_dumps)


def _refused(payload: Any, plural: Any) -> limits.LimitExceeded | None:
    if isinstance(payload, dict) and plural == "agentruns":
        return limits.refusal(payload.get("object"), str(payload.get("operation")))
    if isinstance(payload, dict) and plural == FAILOVER_PLURAL:
        try:  # the schema bounds a failover, but it is checked after the mutating webhook
            limits.walk(payload.get("object"))
        except limits.LimitExceeded as err:
            return err
    return None


async def _answer(fn: Any, review: Any, request: aiohttp.web.Request) -> dict[str, Any]:
    """kopf's ``_serve`` for a review already parsed: a review of a large run is about 1 MB of JSON
    (the object twice), not decoded and parsed a second time. kopf's error mapping is kept."""
    headers = dict(request.headers)
    sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
    try:
        response: dict[str, Any] = await fn(
            review, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=headers
        )
    except AmbiguousResourceError as err:
        raise aiohttp.web.HTTPConflict(reason=str(err) or None) from err
    except UnknownResourceError as err:
        raise aiohttp.web.HTTPNotFound(reason=str(err) or None) from err
    except WebhookError as err:
        raise aiohttp.web.HTTPBadRequest(reason=str(err) or None) from err
    return response
