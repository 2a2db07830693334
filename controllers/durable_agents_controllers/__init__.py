"""kopf wiring for durable-agents: thin handlers that call the core and the shell."""
