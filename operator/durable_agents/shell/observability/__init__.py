"""The observability room.

What the operator tells people and machines about runs: Kubernetes Events, metrics per committed
transition, one trace per run, log lines, and the census of waiting runs.
"""
