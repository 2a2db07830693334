"""The API types of group ``durable-agents.io``, version ``v1alpha1``: the one source of truth.

AgentRun, ActionRecord, AgentPolicy, AgentRunRecord and RegionFailover are defined here once, as
pydantic models. The CRD YAML under ``crds/`` is generated from these models (see
:mod:`durable_agents.api.crdgen`), so API server validation (OpenAPI + CEL) and operator-side
parsing can never disagree. Constraints the API server can enforce alone (enums, bounds,
immutability) are declared here as schema extras.

The checkpoint is deliberately an open object at this layer: the API server must store a
checkpoint written by a *newer* operator untouched, so that an older operator can quarantine it
instead of the API server rejecting or pruning it. The operator validates it
(:mod:`durable_agents.core.checkpoint`).
"""

from durable_agents.api.v1alpha1.actionrecord import *
from durable_agents.api.v1alpha1.agent import *
from durable_agents.api.v1alpha1.agentpolicy import *
from durable_agents.api.v1alpha1.agentrun import *
from durable_agents.api.v1alpha1.controls import *
from durable_agents.api.v1alpha1.definitions import *
from durable_agents.api.v1alpha1.identity import *
from durable_agents.api.v1alpha1.mcp_policy import *
from durable_agents.api.v1alpha1.meta import *
from durable_agents.api.v1alpha1.notifications import *
from durable_agents.api.v1alpha1.policystatus import *
from durable_agents.api.v1alpha1.regionfailover import *
from durable_agents.api.v1alpha1.requests import *
from durable_agents.api.v1alpha1.runrecord import *
from durable_agents.api.v1alpha1.runstatus import *
from durable_agents.api.v1alpha1.schedules import *
from durable_agents.api.v1alpha1.states import *
from durable_agents.api.v1alpha1.steps import *
