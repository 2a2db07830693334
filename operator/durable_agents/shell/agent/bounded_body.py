"""A response body read no further than a bound, under a client that reads bodies itself (the MCP
SDK; the ``anthropic`` client, which reads a body whole before it hands it over).

:func:`bound_body` is called from the HTTP client's response event hook, before the body is read:
it wraps the body's stream, which raises the caller's failure past ``limit`` bytes. The HTTP
client then closes the response, so the connection is dropped, not reused. A hook, not a
transport: it also bounds what a proxy answers. What is counted are the bytes on the wire (an
encoded body is decoded after this stream): a caller that must bound the decoded size asks for no
encoding (:func:`unencoded`) and refuses a body :func:`encoding_of` names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

import httpx2


def unencoded(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with no encoding asked for (any ``Accept-Encoding`` of theirs replaced)."""
    kept = {name: value for name, value in headers.items() if name.lower() != "accept-encoding"}
    return {**kept, "Accept-Encoding": "identity"}


def encoding_of(response: httpx2.Response) -> str | None:
    """The content coding the HTTP client would decode the body from; None for none."""
    coding = response.headers.get("Content-Encoding", "").strip().lower()
    return None if coding in ("", "identity") else coding


class BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, limit: int, refuse: Callable[[], Exception]) -> None:
        self._stream, self._limit, self._refuse = stream, limit, refuse

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise self._refuse()
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def bound_body(response: httpx2.Response, limit: int, refuse: Callable[[], Exception]) -> None:
    """Read ``response`` (its body not read yet) up to ``limit`` bytes; past them, ``refuse()`` is
    raised where the client reads it."""
    stream = response.stream
    if isinstance(stream, httpx2.AsyncByteStream):  # an async client's always is
        response.stream = BoundedBody(stream, limit, refuse)
