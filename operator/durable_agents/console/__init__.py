"""The console: the runs, a run's story and the decisions on it in a browser, as the signed-in user.

The console holds no authority of its own. Every read and every action goes to the API server with
the credentials of the person using it, so RBAC, the operator's admission webhook (its
SubjectAccessReviews, four-eyes, the stamps) and the audit log see that person, never the console:

- ``kubectl agentrun console`` (:mod:`durable_agents.console.__main__`): on 127.0.0.1, with the
  caller's kubeconfig, like ``kubectl proxy``; the URL it prints carries a one-time token,
  exchanged for a session cookie on first use, so another local user cannot drive it.
- ``python -m durable_agents.console --in-cluster``: the same pages behind the cluster's sign-in;
  each request's bearer token (``Authorization`` as an auth proxy passes it,
  ``X-Forwarded-Access-Token``, or a token pasted on the sign-in page) makes that request's API
  client. The console's own ServiceAccount needs no rights on runs.

The pages reuse the kubectl plugin's logic: the list's filters (:mod:`durable_agents.kubectl.list`),
``why`` (:mod:`durable_agents.kubectl.why`), the reveal of ``status --reveal`` and the actions'
functions (:mod:`durable_agents.kubectl.main`, ``answer``, ``controls``). Modules:

- :mod:`.authority`: sessions, the one-time token, whose credentials a request carries.
- :mod:`.security`: the response headers (Content-Security-Policy), the CSRF check, an access
  log without query strings.
- :mod:`.cluster`: the calls to the API server as the user (reads, SelfSubjectAccessReviews,
  the reveal, the actions).
- :mod:`.timeline`: a run's states over time as the geometry of a picture (pure).
- :mod:`.views` and :mod:`.live`: the pages and actions, and the server-sent events that relay
  one watch per page.
- :mod:`.app`: the aiohttp application.
"""
