"""The agent room.

The model planner's I/O: the model endpoint (model_client, model_replies, model_turns), MCP servers
(mcp_tools, tool_calls) and the inputs a run's planner gets (resolver).
"""
