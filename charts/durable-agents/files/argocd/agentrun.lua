-- Argo CD health check for durable-agents.io/AgentRun (argocd-cm:
-- resource.customizations.health.durable-agents.io_AgentRun). It reads the conditions kstatus
-- reads (Stalled, Ready, Reconciling; observedGeneration), so Argo CD, Flux and kpt agree:
-- completed is Healthy; failed, expired, canceled and quarantined are Degraded (with the reason);
-- waiting for a person or an event is Suspended; anything else still at work is Progressing.
local hs = {status = "Progressing", message = "waiting for the operator to accept the run"}
if obj.status == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed ~= generation then
  hs.message = "the operator has not seen generation " .. tostring(generation) .. " yet"
  return hs
end
local conditions = obj.status.conditions or {}
local function condition(kind)
  for _, c in ipairs(conditions) do
    if c.type == kind and c.status == "True" then
      return c
    end
  end
  return nil
end
local stalled = condition("Stalled")
if stalled ~= nil then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "Stalled") .. ": " .. (stalled.message or "")
  return hs
end
if condition("Ready") ~= nil then
  hs.status = "Healthy"
  hs.message = "the run completed"
  return hs
end
local reconciling = condition("Reconciling")
local state = obj.status.state
if state == "waiting_approval" or state == "waiting_input" or state == "waiting_external" then
  hs.status = "Suspended"
end
if reconciling ~= nil then
  hs.message = (reconciling.reason or "Reconciling") .. ": " .. (reconciling.message or "")
elseif state ~= nil then
  hs.message = "the run is " .. state
end
return hs
