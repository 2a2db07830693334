-- Argo CD health check for durable-agents.io/AgentPolicy (argocd-cm:
-- resource.customizations.health.durable-agents.io_AgentPolicy). It reads the conditions kstatus
-- reads: Ready is Healthy; Stalled (the policy cannot be used: runs under it wait) is Degraded;
-- no status yet, or a generation the operator has not seen, is Progressing.
local hs = {status = "Progressing", message = "waiting for the operator to read the policy"}
if obj.status == nil then
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed ~= generation then
  hs.message = "the operator has not seen generation " .. tostring(generation) .. " yet"
  return hs
end
for _, c in ipairs(obj.status.conditions or {}) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = (c.reason or "Stalled") .. ": " .. (c.message or "")
    return hs
  end
end
for _, c in ipairs(obj.status.conditions or {}) do
  if c.type == "Ready" and c.status == "True" then
    hs.status = "Healthy"
    hs.message = c.message or "the policy governs its runs"
    return hs
  end
end
return hs
