"""ASGI middleware that keeps one bad request from costing the server or its connection: a request
body limit, and a boundary that turns any unexpected exception into a generic 500.

Invariants:
- A request body larger than `max_bytes` is never buffered: it is answered 413 with an OpenAI error
  object and `Connection: close`. First the rest of its body is read and dropped, for at most
  `DRAIN_S` seconds and `DRAIN_BYTES` bytes, so that a client still sending gets to read the answer
  (closing a socket with unread data resets it, which can destroy the answer in flight). A body
  within the limit reaches the app whole, as one `http.request` message; later `receive()` calls (a
  disconnect) pass through.
- No response echoes an internal exception's text: `ErrorBoundary` logs the exception with its
  traceback and answers 500 `internal error` with `Connection: close`, so a keep-alive client opens a
  fresh connection instead of finding the old one dropped. If the response had already started, the
  exception is re-raised: the server closes the connection (all it can do mid-response).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wisp.server.protocol import ErrorInfo, ErrorResponse

log = logging.getLogger("wisp.server")

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20  # 4 MiB: a full 128k-token context as JSON token ids fits with room to spare
DRAIN_BYTES = 64 * 2**20  # a refused body is read and dropped up to this much, for at most DRAIN_S seconds
DRAIN_S = 1.0
CLOSE = {"Connection": "close"}


def error_response(status: int, info: ErrorInfo, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=status, headers=headers)


class BodyLimit:
    """Reads each HTTP request body to its end (at most `max_bytes`), then hands it to the app whole."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, 0, more_body=declared > 0)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending: let the app see that
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, size, more)
                return
            chunks.append(body)
            if not more:
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, read: int, more_body: bool) -> None:
        deadline = time.monotonic() + DRAIN_S
        while more_body and read <= DRAIN_BYTES and (left := deadline - time.monotonic()) > 0:
            try:
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                break
            if message["type"] != "http.request":
                return  # the client is gone: nobody to answer
            read += len(message.get("body", b""))
            more_body = message.get("more_body", False)
        info = ErrorInfo(message=f"the request body is larger than this server's limit of {self.max_bytes} bytes "
                                 "(wisp serve --max-request-bytes)", type="invalid_request_error",
                         code="request_too_large")
        await error_response(413, info, CLOSE)(scope, receive, send)


class ErrorBoundary:
    """Turns an exception no handler took into a logged, generic 500 that closes the connection."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            info = ErrorInfo(message="internal error: the server failed on this request (the cause is in its log)",
                             type="server_error", code="internal_error")
            await error_response(500, info, CLOSE)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses such a request before the app sees it
    return None


def _replay(messages: list[Message], receive: Receive) -> Callable:
    """A `receive` that returns `messages` first, then whatever `receive` returns."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
