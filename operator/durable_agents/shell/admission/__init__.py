"""The admission room.

The validating and mutating webhook's rules (authority for AgentRuns, controls, reconciliations,
failovers), and the webhook's registration and serving certificate (manifests, certs).
"""
