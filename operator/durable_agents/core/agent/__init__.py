"""The model planner's pure core: what to ask the model, and what its answer means.

The shell performs the model call (:mod:`durable_agents.shell.agent.model_client`) and the tool calls;
this package only builds requests from the checkpoint's facts and interprets replies.

Modules: ``tools`` (declarations), ``facts`` (the checkpoint's ``agent`` field), ``context`` (the
request), ``interpret`` (the reply), ``limits`` (the bounds), ``exchange`` (request/reply values).
Nothing is re-exported here: :mod:`durable_agents.core.checkpoint` imports ``facts``, which loads
this package first, and ``interpret`` imports the planner, which imports the checkpoint.
"""
