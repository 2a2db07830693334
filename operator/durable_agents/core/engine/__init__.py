"""The run engine: from a snapshot of an AgentRun to the next committed status, purely.

Given what the run's record says (spec, status, checkpoint), the clock, the worker's lease epoch
and what the shell observed when an earlier answer asked for it (one :class:`Observations`
value), :func:`decide` answers one of:

- :class:`Idle`: nothing to do now (a wait whose answer has not arrived; wake at ``wake_at``);
- :class:`NeedRead`: the step needs a read first; the shell performs it and calls back;
- :class:`NeedActions`, :class:`NeedChildren`, :class:`NeedEvidence`: likewise for the ledger's
  action records, child runs, and a fresh read of evidence before acting on an approval;
- :class:`Commit`: the complete next status, to be written in ONE compare-and-swap.

Every commit goes through the state machine's table, increments the state version by exactly one
and stamps the lease epoch (fencing token) into the checkpoint. No I/O, no Kubernetes here.

The modules, from the bottom up (each imports only those below it; ``make lint`` holds the
order): ``snapshot`` and ``decisions`` (what goes in and out), ``commits`` (the one way to build a
commit), ``loading`` (the checkpoint a decision starts from), ``currency`` (whether a decision's
policy and tool set are still current), ``fencing``, ``quarantine``, ``actions``, ``children``,
``retries``, ``runtime``, ``waits``, ``rejections`` (what a rejection does), ``approvals``,
``cancellation``, ``validation`` (resume validation), ``subagents`` (a model's call of another
Agent: a child run), ``model_turns``, ``plan`` (the planner's
next step) and ``decide`` on top.
"""

from durable_agents.core.engine.actions import action_spec
from durable_agents.core.engine.children import PARENT_LABEL, child_body, child_run_name
from durable_agents.core.engine.commits import conditions_for
from durable_agents.core.engine.decide import decide
from durable_agents.core.engine.decisions import (
    Commit,
    Decision,
    Idle,
    NeedActions,
    NeedChildren,
    NeedEvidence,
    NeedModelTurn,
    NeedRead,
    NeedToolCall,
)
from durable_agents.core.engine.fencing import fence
from durable_agents.core.engine.retries import retry_backoff
from durable_agents.core.engine.snapshot import (
    NOTHING_OBSERVED,
    ActionObservation,
    ChildObservation,
    ModelAnswer,
    Observations,
    ReadResult,
    RunSnapshot,
    Settings,
)

__all__ = [
    "NOTHING_OBSERVED",
    "PARENT_LABEL",
    "ActionObservation",
    "ChildObservation",
    "Commit",
    "Decision",
    "Idle",
    "ModelAnswer",
    "NeedActions",
    "NeedChildren",
    "NeedEvidence",
    "NeedModelTurn",
    "NeedRead",
    "NeedToolCall",
    "Observations",
    "ReadResult",
    "RunSnapshot",
    "Settings",
    "action_spec",
    "child_body",
    "child_run_name",
    "conditions_for",
    "decide",
    "fence",
    "retry_backoff",
]
