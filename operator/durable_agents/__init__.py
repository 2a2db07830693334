"""durable-agents: durable AI-agent runs on Kubernetes."""
