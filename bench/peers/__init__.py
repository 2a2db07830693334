"""The peer comparison of docs/proofs "Benchmarks": one workload on durable-agents, DBOS + PostgreSQL
and LangGraph with its SQLite and PostgreSQL checkpointers, on the same machine in the same run.

``python -m bench.peers.run`` (from the repository root) is the entry point; see its ``--help``.
Each system runs in its own worker process (:mod:`bench.peers.worker` protocol), so that the
systems' runtimes (DBOS's global instance, LangGraph's event loop, the operator and its control
plane) never share a Python process, and so that CPU time can be charged to each.
"""
