"""AgentPolicies: their watch events keep the manager's one policy cache current (read by the run
worker, the dispatcher, retention, the stuck check and the admission webhook), and the runs that
waited for a policy go to the worker once it is known. The policy status writer (a runnable fed by
the policy cache and the AgentRun reflector) keeps each policy's status: health, identity, runs.
With the admission webhook on, every create, update and delete of a policy is reviewed
(:mod:`durable_agents.shell.admission.policies`), in the webhook process (:func:`register_admission`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import kopf

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.authority import instant
from durable_agents.core.policy_integrity import force_stamps
from durable_agents.core.request_stamps import identity_of
from durable_agents.shell.admission.definitions import (
    DEFINITION_PATH,
    DEFINITION_STAMP_PATH,
    check_definition,
)
from durable_agents.shell.admission.definitions import PLURALS as DEFINITION_PLURALS
from durable_agents.shell.admission.policies import (
    CLUSTER_POLICY_PATH,
    CLUSTER_POLICY_PLURAL,
    POLICY_PATH,
    POLICY_STAMP_PATH,
    PolicyReview,
    check_policy,
)
from durable_agents.shell.admission.policy_preview import PolicyPreviewer
from durable_agents.shell.intake.policies import CLUSTER
from durable_agents.shell.runs.evidence import EvidenceReader
from durable_agents.shell.runs.policy_status import PolicyStatusWriter
from durable_agents_controllers.manager import Manager


def build(manager: Manager) -> None:
    writer = PolicyStatusWriter(manager.kube, manager.runs.synced, governs=manager.policies.governing_key)
    manager.policies.watchers.append(writer.observe_policy)
    manager.runs.subscribe(writer.observe_run)
    manager.runnables.add(writer)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    manager.builds.append(build)
    watch_definitions(registry, manager)

    @kopf.on.event(GROUP, VERSION, "agentpolicies", registry=registry)
    async def agentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        for run in manager.policies.observe(event.get("type"), body):
            manager.worker.enqueue(run)
        if event.get("type") == "DELETED" and (body["metadata"]["namespace"], body["metadata"]["name"]) in (
            manager.policies.forced
        ):
            # Force-deleted: every run still using it is quarantined (PolicyDeleted) by its worker.
            meta = body.get("metadata") or {}
            namespace = str(meta.get("namespace") or "")
            for name in await manager.policies.users(namespace, str(meta.get("name") or "")):
                manager.worker.enqueue((namespace, name))

    # ClusterAgentPolicies: the same cache, keyed ("", name) (a cluster baseline, or named).
    @kopf.on.event(GROUP, VERSION, CLUSTER_POLICY_PLURAL, registry=registry)
    async def clusteragentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        body["metadata"] = {**dict(body.get("metadata") or {}), "namespace": CLUSTER}
        for run in manager.policies.observe(event.get("type"), body):
            manager.worker.enqueue(run)


def register_admission(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """The policies' admission handlers, on the webhook process's registry (its manager has the
    client, the keyring and its own policy cache, and no AgentRun watch)."""
    # The preview reads the runs' evidence again as the worker does (as each run's ServiceAccount),
    # and lists the runs of the policy's namespace (the webhook process keeps no copy of every run).
    previewer = PolicyPreviewer(
        manager.kube, manager.keyring, EvidenceReader(manager.kube), None, manager.policies.governing_key
    )

    async def review_policy(
        body: kopf.Body, userinfo: kopf.UserInfo, warnings: list[str], **kwargs: Any
    ) -> None:
        # On DELETE the body is the old object (kopf); old and new say what changes.
        old, new = kwargs.get("old"), kwargs.get("new")
        review = PolicyReview(
            operation=str(kwargs.get("operation")),
            new=dict(new) if new is not None else None,
            old=dict(old) if old is not None else None,
            user=identity_of(dict(userinfo)),
            dry_run=bool(kwargs.get("dryrun")),
        )
        verdict = await check_policy(manager.kube, review, manager.policies, manager.keyring, previewer)
        warnings.extend(verdict.warnings)
        if verdict.refused is not None:
            raise kopf.AdmissionError(verdict.refused, code=403)

    kopf.on.validate(
        GROUP,
        VERSION,
        "agentpolicies",
        id=POLICY_PATH,
        operations=["CREATE", "UPDATE", "DELETE"],
        registry=registry,
    )(review_policy)

    async def stamp_policy(
        body: kopf.Body, userinfo: kopf.UserInfo, patch: kopf.Patch, **kwargs: Any
    ) -> None:
        old = kwargs.get("old")
        user = identity_of(dict(userinfo))
        at = instant(datetime.now(UTC))
        marks = force_stamps(
            dict(body), dict(old) if old is not None else None, user.username, at, manager.keyring
        )
        for key, value in marks.items():
            patch.setdefault("metadata", {}).setdefault("annotations", {})[key] = value

    kopf.on.mutate(
        GROUP, VERSION, "agentpolicies", id=POLICY_STAMP_PATH, operations=["UPDATE"], registry=registry
    )(stamp_policy)

    register_definitions(registry, manager)
    kopf.on.validate(
        GROUP,
        VERSION,
        CLUSTER_POLICY_PLURAL,
        id=CLUSTER_POLICY_PATH,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )(review_policy)


def watch_definitions(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """A change of an Agent or ModelConfig: the runs that use it are looked at now (their policy's
    freshness.definitionChanged applies; a run waiting for its Agent starts)."""

    async def definition_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        meta = body.get("metadata") or {}
        kind = str(body.get("kind") or "Agent")
        users = manager.worker.definitions.changed(
            str(meta.get("namespace") or ""), kind, str(meta.get("name") or "")
        )
        for run in users:
            manager.worker.enqueue(run)

    for plural in DEFINITION_PLURALS.values():
        kopf.on.event(GROUP, VERSION, plural, registry=registry)(definition_event)


def register_definitions(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    """Agents and ModelConfigs: their deletion while runs use them, and its force-delete mark
    (the policies' rule and stamp, :mod:`durable_agents.shell.admission.definitions`)."""

    async def review_definition(body: kopf.Body, userinfo: kopf.UserInfo, **kwargs: Any) -> None:
        old, new = kwargs.get("old"), kwargs.get("new")
        refused = await check_definition(
            manager.kube,
            str(kwargs.get("operation")),
            dict(new) if new is not None else None,
            dict(old) if old is not None else None,
            identity_of(dict(userinfo)),
            manager.keyring,
        )
        if refused is not None:
            raise kopf.AdmissionError(refused, code=403)

    async def stamp_definition(
        body: kopf.Body, userinfo: kopf.UserInfo, patch: kopf.Patch, **kwargs: Any
    ) -> None:
        old = kwargs.get("old")
        at = instant(datetime.now(UTC))
        user = identity_of(dict(userinfo))
        marks = force_stamps(
            dict(body), dict(old) if old is not None else None, user.username, at, manager.keyring
        )
        for key, value in marks.items():
            patch.setdefault("metadata", {}).setdefault("annotations", {})[key] = value

    for kind, plural in DEFINITION_PLURALS.items():
        # An Agent's creation too: a cycle of sub-agent calls is refused when it is written.
        writes: list[Literal["CREATE", "UPDATE", "DELETE"]] = ["UPDATE", "DELETE"]
        if kind == "Agent":
            writes = ["CREATE", *writes]
        kopf.on.validate(GROUP, VERSION, plural, id=DEFINITION_PATH, operations=writes, registry=registry)(
            review_definition
        )
        kopf.on.mutate(
            GROUP, VERSION, plural, id=DEFINITION_STAMP_PATH, operations=["UPDATE"], registry=registry
        )(stamp_definition)
