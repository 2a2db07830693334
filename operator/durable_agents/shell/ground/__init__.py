"""The ground room.

Primitives every other room stands on. The Kubernetes client and its thread pool (kube), the
compare-and-swap stores (store), the work queue and its wake-up scheduler, metrics and tracing
set-up, certificates, fault injection and memory release. Imports nothing else of the shell.
"""
