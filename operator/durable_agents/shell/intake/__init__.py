"""The intake room.

What the operator reads from the API server and shares between consumers: the AgentRun list-and-
watch (reflector: one per process, fanned out to its subscribers) and the read-only AgentPolicy
cache (policies: one per process). The manager (controllers) holds both and hands them out.
"""
