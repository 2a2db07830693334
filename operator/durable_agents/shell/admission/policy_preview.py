"""The admission warnings that preview a new AgentPolicy version against the runs under it now.

``kubectl apply --dry-run=server -f policy.yaml`` (what a CI job or a GitOps diff runs) and a real
apply both get, as admission warnings, what the new version would do to the live runs governed by
the policy (:func:`durable_agents.core.policy_preview.preview_run`, the engine's own rules): one
line of counts, then one line per run for at most :data:`MAX_NAMED` runs (the rest counted only),
each short enough that the API server passes it on whole. ``kubectl agentrun policy diff`` reads
the same lines back from a server-side dry run.

Cost per review: the namespace's AgentRuns from the manager's one AgentRun watch (:class:`RunIndex`;
one LIST while it has not synced), and a read of each Kubernetes evidence
reference a waiting approval relies on (as the run's ServiceAccount, like the worker's read before
acting), at most :data:`MAX_READS`; beyond that the evidence is taken as recorded, and said so.
No sealed value is shown (the checkpoint is verified as the worker verifies it): a warning
names runs, states, request IDs and the policy's reasons, never a question, an argument or an
outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from durable_agents.api.v1alpha1 import GROUP, VERSION, AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.checkpoint import KubernetesEvidenceRef, Loaded, load_checkpoint
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.policy_preview import Prediction, RunPreview, preview_run
from durable_agents.core.sealing import Keyring
from durable_agents.shell.agent.resolver import AgentResolver
from durable_agents.shell.effects.plugins import load_effects, load_planners
from durable_agents.shell.ground.kube import Kube, ObjectKey

log = logging.getLogger(__name__)

MAX_NAMED: Final = 10
"""Runs named one per warning; the others are counted in the first warning only."""
PREVIEW_SECONDS: Final = 6.0
"""The preview's share of the webhook's 10 s: past it, the review goes on with a warning saying so."""
MAX_READS: Final = 64
"""Evidence references read again per review; beyond, taken as recorded."""
WARNING_LENGTH: Final = 250
"""The API server may cut warnings longer than 256 characters: each is kept under it."""
RUN_PREFIX: Final = "policy preview run "
"""How a per-run warning starts (``kubectl agentrun policy diff`` parses these)."""

_WAITING: Final = (RunState.WAITING_APPROVAL, RunState.WAITING_EXTERNAL)


def runs_under_policy(
    runs: list[Mapping[str, Any]],
    namespace: str,
    name: str,
    governs: Callable[[Mapping[str, Any]], ObjectKey | None] | None = None,
) -> list[Mapping[str, Any]]:
    """The runs the AgentPolicy ``namespace/name`` governs: those whose ``spec.policyRef`` names it,
    and those ``governs`` resolves to it (the namespace's default, or recorded at acceptance)."""
    return [
        run
        for run in runs
        if (run.get("metadata") or {}).get("namespace") == namespace
        and (
            ((run.get("spec") or {}).get("policyRef") or {}).get("name") == name
            or (governs is not None and governs(run) == (namespace, name))
        )
    ]


def _settings(base: Settings, name: str, spec: AgentPolicySpec | None) -> Settings:
    """The engine settings of a run under ``spec`` (as the policy cache gives them)."""
    if spec is None:
        return replace(base, policy_name=name)
    return replace(
        base,
        wait_expiries=spec.wait_expiries,
        policy_name=name,
        policy_version=spec.version,
        tiers={**base.tiers, **spec.tiers},
        policy=spec,
    )


def _spec(obj: Mapping[str, Any] | None) -> AgentPolicySpec | None:
    if obj is None:
        return None
    try:
        return AgentPolicySpec.model_validate(obj.get("spec") or {})
    except ValueError:
        return None  # an invalid stored policy governs nothing (the policy cache ignores it)


class Rereader(Protocol):
    """Reads a run's evidence again as its ServiceAccount (the worker's reader, shell/runs)."""

    async def reread(
        self, run: RunSnapshot, ref: KubernetesEvidenceRef, now: datetime
    ) -> KubernetesEvidenceRef | None: ...


class RunIndex:
    """The AgentRuns the preview looks at, fed by the manager's one AgentRun list-and-watch (so a
    review costs no LIST): a waiting run whole, any other as a stub (its name, policy and state:
    it is counted, never previewed), by namespace."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Mapping[str, Any]]] = {}
        self.synced: asyncio.Event | None = None  # the watch's: set once its first list is delivered

    def follow(self, synced: asyncio.Event) -> None:
        """Start afresh from a new list-and-watch (each start of the manager makes one)."""
        self.runs.clear()
        self.synced = synced

    def observe(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        held = self.runs.setdefault(namespace, {})
        if event_type == "DELETED":
            held.pop(name, None)
            return
        state = (body.get("status") or {}).get("state")
        if state in {s.value for s in _WAITING}:
            held[name] = body
        else:
            spec = {"policyRef": (body.get("spec") or {}).get("policyRef")}
            held[name] = {"metadata": meta, "spec": spec, "status": {"state": state or "pending"}}

    def listed(self, namespace: str) -> list[Mapping[str, Any]] | None:
        """The namespace's runs, or None until the first list has been delivered."""
        if self.synced is None or not self.synced.is_set():
            return None
        return list(self.runs.get(namespace, {}).values())


class PolicyPreviewer:
    """What the admission webhook needs to preview a policy: the operator's effect tiers and
    planners (as the worker has them), the worker's evidence reader (None: evidence is taken as
    recorded, and the summary says for how many runs), the keyring."""

    def __init__(
        self,
        kube: Kube,
        keyring: Keyring | None,
        reader: Rereader | None,
        index: RunIndex | None = None,
        governs: Callable[[Mapping[str, Any]], ObjectKey | None] | None = None,
    ) -> None:
        self.governs = governs  # which policy governs a run (the policy cache's resolution)
        tiers = {name: effect.tier for name, effect in load_effects().items()}
        self.kube, self.index = kube, index
        self.base = Settings(tiers=tiers, available_effects=frozenset(tiers), keyring=keyring)
        self.agents = AgentResolver(kube, keyring, load_planners())
        self.reader = reader

    async def preview(
        self, namespace: str, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> tuple[list[RunPreview], int] | None:
        """Each run under the policy, previewed, and how many of them had their evidence taken as
        recorded (not read: over budget); None when the new object is no valid policy."""
        proposed_spec = _spec(new)
        if proposed_spec is None:
            return None
        items = self.index.listed(namespace) if self.index is not None else None
        source = "the AgentRun watch" if items is not None else "a LIST"
        if items is None:  # no index (or not synced yet): one LIST
            listed = await self.kube.call(
                self.kube.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentruns"
            )
            items = listed.get("items") or []
        now, reads, unread = datetime.now(UTC), MAX_READS, 0
        current_spec = _spec(old)
        out = []
        under = runs_under_policy(items, namespace, name, self.governs)
        log.info("policy preview of %s/%s: %d run(s) under it, from %s", namespace, name, len(under), source)
        for obj in under:
            if obj.get("status", {}).get("state") not in {s.value for s in _WAITING}:
                state = str(obj.get("status", {}).get("state") or "pending")
                meta = obj.get("metadata") or {}
                out.append(
                    RunPreview(
                        namespace,
                        str(meta.get("name")),
                        state,
                        Prediction.UNAFFECTED,
                        f"{state}: no decision of the policy is pending",
                    )
                )
                continue
            run = RunSnapshot.from_object(obj)
            current = _settings(self.base, name, current_spec)
            proposed = _settings(self.base, name, proposed_spec)
            fresh, reads = await self._fresh_evidence(run, now, reads)
            unread += int(fresh is None and run.state is RunState.WAITING_APPROVAL)
            if run.state in _WAITING:  # a model run's inputs (its tools' tiers): only where it counts
                await self.agents.prepare(run, proposed)
            planner = self.agents.planner_for(run)
            out.append(
                preview_run(
                    run, now=now, planner=planner, current=current, proposed=proposed, fresh_evidence=fresh
                )
            )
        return out, unread

    async def _fresh_evidence(
        self, run: RunSnapshot, now: datetime, budget: int
    ) -> tuple[dict[str, KubernetesEvidenceRef | None] | None, int]:
        """The run's Kubernetes evidence as it reads now (a waiting approval's only), within budget."""
        if run.state is not RunState.WAITING_APPROVAL or self.reader is None:
            return None, budget
        loaded = load_checkpoint(run.raw_checkpoint)
        if not isinstance(loaded, Loaded):
            return None, budget
        refs = [ref for ref in loaded.checkpoint.evidence if isinstance(ref, KubernetesEvidenceRef)]
        if len(refs) > budget:
            return None, budget  # taken as recorded (counted in the summary)
        return {ref.id: await self.reader.reread(run, ref, now) for ref in refs}, budget - len(refs)


def warnings_for(
    namespace: str,
    name: str,
    old_version: str | None,
    new_version: str,
    previews: list[RunPreview],
    unread: int = 0,
) -> list[str]:
    """The warnings: one line of counts, then one per run (at most :data:`MAX_NAMED`)."""
    counts = Counter(p.prediction for p in previews)
    affected = [p for p in previews if p.prediction is not Prediction.UNAFFECTED]
    summary = (
        f"policy preview {namespace}/{name} {old_version or '(new)'} -> {new_version}: "
        f"{len(previews)} run(s) under it; waiting approvals: "
        f"{counts[Prediction.STAYS_VALID]} stay valid, {counts[Prediction.NEEDS_REAPPROVAL]} need "
        f"re-approval, {counts[Prediction.NEEDS_REFRESHED_EVIDENCE]} need refreshed evidence, "
        f"{counts[Prediction.EXPIRES]} expire, {counts[Prediction.NO_LONGER_NEEDS_APPROVAL]} no longer "
        f"need approval; pending actions: {counts[Prediction.NEWLY_NEEDS_APPROVAL]} newly need approval; "
        f"refused: {counts[Prediction.REFUSED]}"
        + (f"; evidence taken as recorded (not read) for {unread} run(s)" if unread else "")
    )
    lines = [summary]
    for p in affected[:MAX_NAMED]:
        about = f"{p.state}, {p.request_id}" if p.request_id else p.state
        lines.append(f"{RUN_PREFIX}{p.name}: {p.prediction.value} ({about}): {p.detail}"[:WARNING_LENGTH])
    if len(affected) > MAX_NAMED:
        lines.append(f"policy preview: {len(affected) - MAX_NAMED} more affected run(s) not named")
    return lines


async def preview_warnings(
    previewer: PolicyPreviewer, operation: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> list[str]:
    """The preview's warnings for an AgentPolicy CREATE or UPDATE ([] for anything else). A
    preview that fails costs the review nothing but its warnings: it never refuses a policy."""
    if operation not in ("CREATE", "UPDATE") or new is None:
        return []
    if old is not None and (old.get("spec") or {}) == (new.get("spec") or {}):
        return []  # the same rules (a re-apply, a label): nothing changes for any run, quiet
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        previews = await asyncio.wait_for(previewer.preview(namespace, name, old, new), PREVIEW_SECONDS)
    except Exception as err:  # the preview is advice: a failure is said, never a refusal
        log.warning("policy preview of %s/%s failed: %s", namespace, name, err)
        return [f"policy preview {namespace}/{name}: not available ({type(err).__name__})"]
    if previews is None:
        return []
    old_spec, new_spec = _spec(old), _spec(new)
    assert new_spec is not None
    old_version = old_spec.version if old_spec else None
    return warnings_for(namespace, name, old_version, new_spec.version, *previews)


_PREVIEWERS: dict[int, PolicyPreviewer] = {}


def previewer_for(kube: Kube, keyring: Keyring | None) -> PolicyPreviewer:
    """A previewer without an evidence reader for ``kube`` (made once: loading plugins is not per
    review), for a caller that has none of its own (the manager passes one that reads)."""
    held = _PREVIEWERS.get(id(kube))
    if held is None or held.kube is not kube:
        held = _PREVIEWERS[id(kube)] = PolicyPreviewer(kube, keyring, None)
    return held
