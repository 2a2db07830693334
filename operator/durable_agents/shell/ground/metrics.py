"""Prometheus metrics of the operator (prometheus-client): transitions, waits, leases, the ledger."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

API_WRITES = Counter(
    "durable_agents_api_writes_total", "API writes made by the operator", ["resource", "verb"]
)
TRANSITIONS = Counter("durable_agents_transitions_total", "Committed run transitions", ["event"])
TRANSITIONS_PER_WRITE = Histogram(
    "durable_agents_transitions_per_write",
    "Transitions carried by one status write (commits happen at semantic boundaries only)",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16),
)
COMMIT_CONFLICTS = Counter(
    "durable_agents_commit_conflicts_total", "Status commits refused with 409 (stale read)", ["resource"]
)
BATCHES_OUTDATED = Counter(
    "durable_agents_batches_outdated_total",
    "Batches of run transitions thrown away right before their write: decided under a policy that changed",
)
LEASE_TAKEOVERS = Counter(
    "durable_agents_lease_takeovers_total", "Run leases taken over from an expired holder"
)
TERMINAL_OUTCOMES = Counter(
    "durable_agents_terminal_outcomes_total", "Runs that reached a terminal state", ["state", "reason"]
)
QUARANTINES = Counter("durable_agents_quarantines_total", "Runs quarantined", ["reason"])
CHECKPOINT_MIGRATIONS = Counter(
    "durable_agents_checkpoint_migrations_total", "Checkpoints migrated on read", ["from_version"]
)
RESUME_FAILURES = Counter(
    "durable_agents_resume_failures_total",
    "Resume validations that did not let the run go on as it was, by reason",
    ["reason"],
)
WAITING_RUNS = Gauge(
    "durable_agents_waiting_runs", "Runs in each waiting state whose shard this replica holds", ["state"]
)
COMMIT_LATENCY = Histogram(
    "durable_agents_commit_seconds",
    "Status commit round trip",
    ["resource"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2),
)
DUPLICATE_SUPPRESSIONS = Counter(
    "durable_agents_duplicate_suppressions_total",
    "Action intents refused by the API server because the record already existed (AlreadyExists)",
)
ACTION_DISPATCHES = Counter(
    "durable_agents_action_dispatches_total", "Effect dispatches by answer", ["effect", "answer"]
)
MODEL_CALLS = Counter(
    "durable_agents_model_calls_total", "Model calls of the model planner, by answer", ["answer"]
)
MCP_CALLS = Counter(
    "durable_agents_mcp_read_calls_total",
    "Read-only MCP tool calls of the model planner, by answer (consequential ones are actions)",
    ["answer"],
)
ACTION_QUERIES = Counter(
    "durable_agents_action_queries_total", "Authoritative-system queries by answer", ["effect", "answer"]
)
UNKNOWN_OUTCOME_SECONDS = Histogram(
    "durable_agents_unknown_outcome_seconds",
    "How long an action's outcome stayed unknown before reconciliation",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
)
UNKNOWN_OUTCOMES = Gauge("durable_agents_unknown_outcomes", "Actions whose outcome is unknown right now")
CANCELLATION_LATENCY = Histogram(
    "durable_agents_cancellation_latency_seconds",
    "From a task cancellation request (stamped by the webhook) to the commit that stops new work",
    buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30),
)
SCHEDULED_WAKEUPS = Gauge(
    "durable_agents_scheduled_wakeups",
    "Keys with a pending wake-up (parked runs, retries, claims)",
    ["queue"],
)
OWN_WRITES_SKIPPED = Counter(
    "durable_agents_own_writes_skipped_total",
    "Watch events of the operator's own writes not decided again (already decided from them)",
    ["queue"],
)
RESEALED = Counter(
    "durable_agents_resealed_total",
    "Writes of the key rotation pass: data keys rewrapped, checkpoints re-stamped under the active key",
    ["what"],
)
RESEAL_SKIPPED = Counter(
    "durable_agents_reseal_skipped_total",
    "Runs the key rotation pass left as they were (conflict, unverified, undecryptable, refused, ...)",
    ["reason"],
)
INTERNAL_ERRORS = Counter(
    "durable_agents_internal_errors_total",
    "Exceptions in a run's unit of work (retried with backoff, then the run quarantined InternalError)",
    ["stage"],
)
REGION_ADOPTIONS = Counter(
    "durable_agents_region_adoptions_total",
    "Runs adopted by an explicit region failover, by source and target region",
    ["source", "target"],
)

# --- the seed's metrics, completed (issue 17); the label values known at start-up are initialised
# (shell/observability/commit_metrics.py) so each series exists, at 0, on a live operator.
DURATION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)
OLDEST_WAITING = Gauge(
    "durable_agents_oldest_waiting_seconds",
    "Age of the oldest run in each waiting state, among the runs whose shard this replica holds",
    ["state"],
)
WAITING_SECONDS = Histogram(
    "durable_agents_waiting_seconds", "How long waits lasted (observed when a wait ends)", ["state"],
    buckets=DURATION_BUCKETS,
)  # fmt: skip
APPROVAL_LATENCY = Histogram(
    "durable_agents_approval_latency_seconds",
    "From an approval request to the commit that records its decision",
    buckets=DURATION_BUCKETS,
)
OLDEST_UNKNOWN_OUTCOME = Gauge(
    "durable_agents_oldest_unknown_outcome_seconds",
    "Age of the oldest action outcome that is unknown right now (0: none)",
)
CHECKPOINT_MIGRATION_ERRORS = Counter(
    "durable_agents_checkpoint_migration_errors_total",
    "Checkpoints that could not be migrated (failed, or an unknown schema version): quarantined",
    ["from_version"],
)
MODEL_CALLS_PER_RUN = Histogram(
    "durable_agents_model_calls_per_run",
    "Model calls of a model-planned run (observed when it ends)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
)
MODEL_TOKENS_PER_RUN = Histogram(
    "durable_agents_model_tokens_per_run",
    "Input plus output tokens of a model-planned run (observed when it ends)",
    buckets=(100, 1_000, 5_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000),
)
MODEL_TOKENS = Counter(
    "durable_agents_model_tokens_total", "Tokens the model reported, by kind (input, output)", ["kind"]
)
OWNERSHIP_CHANGES = Counter(
    "durable_agents_ownership_changes_total",
    "Shard and region ownership changes seen by this process (gained or lost), by kind",
    ["kind"],
)
EVENTS_DROPPED = Counter(
    "durable_agents_events_dropped_total",
    "Events of committed transitions not posted because too many were waiting (the status history has them)",
)
REGION_OWNED = Gauge(
    "durable_agents_region_owned", "1 while this process owns the region, else 0", ["region"]
)
GC_PAUSES = Histogram(
    "durable_agents_gc_pause_seconds",
    "How long a collection of Python's cyclic garbage collector held the process (nothing else ran,"
    " Lease renewals included), by generation",
    ["generation"],
    buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
LOOP_STALLS = Histogram(
    "durable_agents_event_loop_stall_seconds",
    "How long the event loop stood still (it starts every request, Lease renewals included), for each"
    " stall of 2 s or more",
    buckets=(2, 3, 5, 7.5, 10, 15, 30, 60),
)
