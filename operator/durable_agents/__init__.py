"""durable-agents: durable AI-agent runs on Kubernetes."""

__version__ = "0.2.0"
