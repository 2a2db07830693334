"""The API server's error said for people, shared by the `kubectl agentrun` commands."""

from __future__ import annotations

import contextlib
import json

from kubernetes.client.rest import ApiException


def api_message(err: ApiException) -> str:
    """The Status message of an API error (its body), else its reason."""
    message = err.body
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(err.body).get("message", err.body)
    return str(message or err.reason)
