"""The intake room.

What the operator reads from the API server and shares between consumers: the AgentRun list-and-
watch (reflector) and the read-only AgentPolicy cache (policies).
"""
