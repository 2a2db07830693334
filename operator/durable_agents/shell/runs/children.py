"""Child runs: created AS the parent's ServiceAccount, observed, and canceled with the parent.

A parent's step names its child; the engine commits the child's name in the parent's checkpoint
before this module creates it (the intent first, as for effects). Each child is created with the
operator's stamp (:func:`~durable_agents.core.engine.children.stamp_child`), and an object under a
child's name is adopted only if it carries that stamp and the step's spec: anything else (a run
someone created first under the expected name, with the parent as owner or not) is a foreign
child, reported as ``ForeignChild``, never adopted and never canceled. A creation refused with
AlreadyExists is therefore no success by itself: the object found is judged like any other.
Creating and canceling a child are impersonated, so a run can start or stop only what its
ServiceAccount may: no confused deputy. A creation the API server refuses for good (403: the
ServiceAccount may not create AgentRuns; 422: the child is invalid) is a definite failure of the
step (``ChildNotPermitted`` / ``ChildInvalid``, with a Warning Event), never retried forever.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import API_VERSION, AgentRunStatus, Identity
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import ChildObservation, NeedChildren, RunSnapshot
from durable_agents.core.engine.children import (
    CHILD_INVALID,
    CHILD_NOT_PERMITTED,
    FOREIGN_CHILD,
    foreign_child,
    stamp_child,
)
from durable_agents.core.engine.loading import forged_object
from durable_agents.core.regions import owning_region
from durable_agents.core.request_stamps import stamps
from durable_agents.core.sealed_values import DATA_KEY_ANNOTATION, open_data_key, wrap_data_key
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import FaultPoints, process_faults
from durable_agents.shell.ground.kube import Kube, service_account_user
from durable_agents.shell.ground.store import Gone, RunStore
from durable_agents.shell.observability.events import EventRecorder

log = logging.getLogger(__name__)
# API answers to a child's creation that no retry changes: the step fails with this reason.
_DEFINITE = {403: CHILD_NOT_PERMITTED, 422: CHILD_INVALID}


def _api_message(err: ApiException) -> str:
    """The Status message of an API error (its body), else its reason."""
    try:
        return str(json.loads(err.body or "{}").get("message") or err.reason)[:512]
    except (ValueError, AttributeError):
        return str(err.reason)


def with_data_key(body: dict[str, Any], parent: RunSnapshot, keyring: Keyring) -> dict[str, Any]:
    """The child shares its parent's data key (its steps' sealed values are the parent's, copied),
    wrapped for the child's name; a parent whose key does not open gives none (its child's sealed
    arguments then fail to unseal: nothing is sent)."""
    try:
        data_key = open_data_key(keyring, parent.data_key, parent.namespace, parent.name)
    except UndecryptableError as err:
        log.warning("child of %s/%s gets no data key: %s", parent.namespace, parent.name, err)
        return body
    meta = body["metadata"]
    wrapped = wrap_data_key(keyring, data_key, parent.namespace, meta["name"], entropy=os.urandom)
    annotations = {**(meta.get("annotations") or {}), DATA_KEY_ANNOTATION: wrapped}
    return {**body, "metadata": {**meta, "annotations": annotations}}


class ChildRuns:
    def __init__(
        self,
        kube: Kube,
        store: RunStore,
        events: EventRecorder,
        keyring: Keyring | None,
        faults: FaultPoints | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.events = events
        self.keyring = keyring  # None: children are created unstamped, so none is ever adopted
        self.faults = faults or process_faults()
        self._reported: set[str] = set()  # uids of foreign children already reported by an Event
        self._refusals: set[tuple[str, str, str]] = set()  # (parent uid, child, reason) reported
        self._forged: set[tuple[str, str]] = set()  # (child uid, its stateVersion) reported as forged

    def _resource(self) -> Any:
        return self.kube.dynamic().resources.get(api_version=API_VERSION, kind="AgentRun")

    async def create(self, parent: RunSnapshot, body: dict[str, Any]) -> str | None:
        """Create the child, stamped; one that exists already is judged when it is observed.

        Returns the reason the API server refused it for good (403, 422), reported by an Event;
        None when it was created or exists."""
        user = service_account_user(parent.namespace, parent.spec.service_account_name)
        # The child is its parent's owning region's (the parent's home, or the region a stamped
        # failover moved it to). Left unset, the admission webhook would give it the region of
        # whichever deployment serves the webhook (or none: `default`): another region would
        # advance it, and a failover of its parent's region would leave it behind.
        ownership = parent.status.ownership.wire() if parent.status.ownership is not None else None
        region = owning_region(parent.spec.region, ownership, parent.run_id, self.keyring)
        body = {**body, "spec": {**body["spec"], "region": region}}
        if self.keyring is not None:
            body = stamp_child(body, self.keyring, parent.run_id)
            body = with_data_key(body, parent, self.keyring)
            # Stamped as the admission webhook stamps a run its creator may run as this
            # ServiceAccount (a ServiceAccount may act as itself): with the webhook off, the
            # child is still provably the operator's; with it on, the webhook stamps it again.
            body = {**body, "metadata": {**body["metadata"], "namespace": parent.namespace}}
        else:
            name = body["metadata"]["name"]
            log.error("no keyring: child run %s is created unstamped and will not be adopted", name)
        keyring = self.keyring

        def create() -> None:
            sent = body
            if keyring is not None:
                # Stamped in the request that creates it: the stamp's time must agree with the
                # child's creationTimestamp (core.authority.creation_unbound).
                creator = stamps("CREATE", body, None, Identity(username=user), datetime.now(UTC), keyring)
                sent = {**body, "spec": {**body["spec"], **creator}}
            self.kube.dynamic().create(
                self._resource(),
                body=sent,
                namespace=parent.namespace,
                header_params={"Impersonate-User": user},
            )

        # A creation is a write of record for the fault points: a test can die right after it.
        async with self.faults.serialized():
            self.faults.before()
            try:
                await self.kube.call(create)
            except ApiException as err:
                metrics.API_WRITES.labels("agentruns", "create").inc()
                if err.status in _DEFINITE:
                    return await self._refused(parent, body["metadata"]["name"], user, err)
                if err.status != 409:
                    raise
                log.info("child run %s/%s exists already", parent.namespace, body["metadata"]["name"])
                return None
            metrics.API_WRITES.labels("agentruns", "create").inc()
            self.faults.after()
        return None

    async def _refused(self, parent: RunSnapshot, name: str, user: str, err: ApiException) -> str:
        """A Warning Event on the parent: its child cannot be created, so its step fails."""
        reason = _DEFINITE[int(err.status)]
        message = (
            f"creating child run {parent.namespace}/{name} as {user} was refused"
            f" ({err.status} {err.reason}): {_api_message(err)}"
        )[:1024]
        log.warning("run %s/%s: %s", parent.namespace, parent.name, message)
        if (parent.uid, name, reason) not in self._refusals:  # one Event per child and reason
            self._refusals.add((parent.uid, name, reason))
            ref = {"metadata": {"name": parent.name, "namespace": parent.namespace, "uid": parent.uid}}
            await self.events.record(ref, reason, message, warning=True)
        return reason

    async def cancel(self, parent: RunSnapshot, child: dict[str, Any], reason: str) -> None:
        """Ask a running child to cancel (task scope, so its own children follow), once."""
        request_id = f"parent-{parent.status.state_version}"
        if any(k.startswith("parent-") for k in (child.get("spec") or {}).get("cancellations") or {}):
            return  # asked already
        user = service_account_user(parent.namespace, parent.spec.service_account_name)
        request = {"scope": "task", "reason": reason[:1024]}
        patch: dict[str, Any] = {"spec": {"cancellations": {request_id: request}}}
        if self.keyring is not None:  # stamped as the webhook would: the child acts on it either way
            spec = child.get("spec") or {}
            requests = {**(spec.get("cancellations") or {}), request_id: request}
            asked = {**child, "spec": {**spec, "cancellations": requests}}
            now = datetime.now(UTC)
            patch["spec"].update(stamps("UPDATE", asked, child, Identity(username=user), now, self.keyring))
        name = child["metadata"]["name"]

        def send() -> None:
            self.kube.dynamic().patch(
                self._resource(),
                name=name,
                namespace=parent.namespace,
                body=patch,
                content_type="application/merge-patch+json",
                header_params={"Impersonate-User": user},
            )

        await self.kube.call(send)
        metrics.API_WRITES.labels("agentruns", "patch").inc()
        log.info("asked child run %s/%s to cancel: %s", parent.namespace, name, reason)

    async def observe(self, parent: RunSnapshot, need: NeedChildren) -> dict[str, ChildObservation]:
        """Each child's state; a missing child is created from its body, a running one canceled if
        asked; a foreign object under a child's name is reported and left alone."""
        seen: dict[str, ChildObservation] = {}
        for name, body in need.records.items():
            try:
                child = await self.store.get(parent.namespace, name)
            except Gone:
                if body is None:
                    # Gone (deleted by someone): that is a terminal fact, not something to wait on.
                    seen[name] = ChildObservation(RunState.CANCELED, "ChildDeleted")
                    continue
                refused = await self.create(parent, body)
                # Refused for good: the child never ran, a terminal fact for the parent's step.
                seen[name] = (
                    ChildObservation(RunState.FAILED, refused)
                    if refused
                    else ChildObservation(RunState.PENDING)
                )
                continue
            why = foreign_child(
                child, body, keyring=self.keyring, parent_run_id=parent.run_id, parent_name=parent.name
            )
            if why is not None:
                await self._report_foreign(parent, child, why)
                seen[name] = ChildObservation(RunState.FAILED, FOREIGN_CHILD)
                continue
            forged = forged_object(child, self.keyring)
            if forged is not None:
                # Not the operator's word on the child: the parent waits (its own worker
                # quarantines the child, IntegrityFailed) and never proceeds on a forged outcome.
                await self._report_forged(parent, child, forged)
                seen[name] = ChildObservation(RunState.QUARANTINED, "IntegrityFailed")
                continue
            status = AgentRunStatus.model_validate(
                {k: v for k, v in (child.get("status") or {}).items() if k != "checkpoint"}
            )
            if need.cancel is not None and not status.state.terminal:
                await self.cancel(parent, child, need.cancel)
            reason = status.outcome.reason if status.outcome else None
            # Its answer too (a sub-agent's), from a status whose stamp verified just above.
            result = status.outcome.result if status.outcome else None
            seen[name] = ChildObservation(status.state, reason, result)
        return seen

    async def _report_forged(self, parent: RunSnapshot, child: dict[str, Any], why: str) -> None:
        """A Warning Event on the parent: its child's status is not believed, once per child state."""
        meta = child["metadata"]
        seen = (str(meta.get("uid")), str((child.get("status") or {}).get("stateVersion")))
        log.warning(
            "run %s/%s: child %s is not believed: %s", parent.namespace, parent.name, meta["name"], why
        )
        if seen in self._forged:
            return
        self._forged.add(seen)
        ref = {"metadata": {"name": parent.name, "namespace": parent.namespace, "uid": parent.uid}}
        message = f"child run {meta['namespace']}/{meta['name']} is not believed ({why}): waiting for it"
        await self.events.record(ref, "ChildIntegrityFailed", message[:1024], warning=True)

    async def _report_foreign(self, parent: RunSnapshot, child: dict[str, Any], why: str) -> None:
        """A Warning Event on the parent naming the foreign object, once per object."""
        meta = child["metadata"]
        message = (
            f"AgentRun {meta['namespace']}/{meta['name']} (uid {meta.get('uid')}) is under the name of"
            f" a child of this run but was not created by the operator ({why}): not adopted"
        )
        log.warning("run %s/%s: %s", parent.namespace, parent.name, message)
        if meta.get("uid") in self._reported:
            return
        self._reported.add(str(meta.get("uid")))
        ref = {"metadata": {"name": parent.name, "namespace": parent.namespace, "uid": parent.uid}}
        await self.events.record(ref, FOREIGN_CHILD, message, warning=True)
