"""The runs room.

The run loop and what acts on whole runs: the worker and its batched commits, failures, evidence
reads, child runs, on-call controls, retention, stuck detection, reveal and failover.
"""
