"""One status write for a batch of transitions: the commit at a semantic boundary.

The worker decides transition after transition, applying each to the record in memory; the batch
is written as ONE status (each transition still in ``status.history`` with its own state version)
by compare-and-swap over the record as it was read, and only then reported (metrics, a log line
each, an Event for what a person acts on). A 409 throws the whole batch away.

Each transition remembers the AgentPolicy it was decided under. Right before the write (after
anything that delayed it), a batch that makes a policy decision binding (an intent, a
revalidation, an approval request) is checked against the policy as the watch cache knows it
now: decided under another one, it is thrown away like a 409 and decided again from what is
stored (:func:`durable_agents.core.engine.currency.batch_outdated`). A dictionary lookup and a
comparison: no extra API call. A batch carrying an approved intent also reads the Kubernetes
evidence its revalidation relied on once more (a read per reference, once per approval): changed,
the batch is thrown away the same way and the revalidation does what the policy says.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import AgentPolicySpec
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.engine import Commit, RunSnapshot
from durable_agents.core.engine.currency import batch_outdated, evidence_outdated, evidence_to_recheck
from durable_agents.shell.ground import metrics
from durable_agents.shell.ground.faults import inject_internal_error
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.store import Conflict, Outdated, Precondition, Recheck, RunStore
from durable_agents.shell.intake.policies import PolicyCache
from durable_agents.shell.observability.reporting import CommitReporter
from durable_agents.shell.runs.evidence import EvidenceReader
from durable_agents.shell.runs.failures import Failures

log = logging.getLogger("durable_agents.shell.runs.worker")

Batch = list[tuple[RunState, Commit, AgentPolicySpec | None]]
"""Transitions decided since the last write: the state each started from, its commit, and the
policy it was decided under (None: the run names none, or it was not known)."""


class BatchWriter:
    def __init__(
        self,
        store: RunStore,
        reporter: CommitReporter,
        failures: Failures,
        versions: dict[ObjectKey, int],
        policies: PolicyCache,
    ) -> None:
        self.store, self.reporter, self.failures = store, reporter, failures
        self.versions = versions  # the worker's newest state version per run, kept current here
        self.policies = policies  # the watch cache the batch's decisions read their policy from
        self.reader = EvidenceReader(store.kube)  # an approved intent's evidence, read again

    async def write(
        self,
        key: ObjectKey,
        written: dict[str, Any],
        status: dict[str, Any],
        batch: Batch,
        *,
        quarantine: bool = False,
    ) -> dict[str, Any] | None:
        """Write ``status`` (the batch's last commit) over ``written`` iff it is still at that
        resourceVersion, then report each transition. None on 409: the batch is thrown away.
        The caller has checked that it still holds the right to advance the run."""
        first, last = batch[0][1], batch[-1][1]
        # A failure here names the batch's first transition, from the state as stored.
        self.failures.at(key, "commit", RunSnapshot.from_object(written), first.event.value)
        if not quarantine:  # the InternalError quarantine itself is not the injected bug's victim
            inject_internal_error(key[1], "commit")  # a test's stand-in for a bug (inert otherwise)
        try:
            current = self._still_current(key, written, batch)
            out = await self.store.commit_status(
                written, status, current, self._evidence_recheck(written, batch)
            )
        except Outdated as err:
            metrics.BATCHES_OUTDATED.inc()
            log.info("batch of %d transition(s) for %s/%s thrown away: %s", len(batch), *key, err)
            return None
        except Conflict:
            log.info("commit to %s/%s refused (409: the record moved); reloading", *key)
            return None
        self.versions[key] = last.status.state_version
        for before, commit, _ in batch:
            self.reporter.report(out, before, commit)
        metrics.TRANSITIONS_PER_WRITE.observe(len(batch))
        return out

    def _still_current(self, key: ObjectKey, written: dict[str, Any], batch: Batch) -> Precondition:
        """The write's precondition: the batch was decided under the policy the run has now."""
        governing = self.policies.governing_key(written)
        name = governing[1] if governing is not None else None
        commits, decided_under = [commit for _, commit, _ in batch], [policy for *_, policy in batch]

        def outdated() -> str | None:
            current = self.policies.get(governing) if governing is not None else None
            return batch_outdated(commits, decided_under, current, name)

        return outdated

    def _evidence_recheck(self, written: dict[str, Any], batch: Batch) -> Recheck | None:
        """For a batch carrying an approved intent: its evidence read again right before the
        write (a read per reference, once per approval; None, no read, for any other batch)."""
        refs = evidence_to_recheck([commit for _, commit, _ in batch])
        if not refs:
            return None
        run, policy = RunSnapshot.from_object(written), batch[-1][2]

        async def recheck() -> str | None:
            now = datetime.now(UTC)
            fresh = {ref.id: await self.reader.reread(run, ref, now) for ref in refs}
            return evidence_outdated(refs, fresh, policy)

        return recheck
