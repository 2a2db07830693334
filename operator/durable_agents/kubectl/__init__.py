"""The kubectl plugin (``kubectl agentrun``): one module per verb, dispatched by :mod:`.main`.

It may import the API types and the pure core; the shell only where a verb talks to the cluster.
"""
