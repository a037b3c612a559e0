"""Limits on the server's connections, so that clients that connect and stall cannot exhaust it (slowloris).

uvicorn's HTTP/1.1 protocol closes a connection that stays idle between requests (`keep_alive_s`), but once a
request's first bytes arrive it waits for the rest for ever, and it accepts every connection the listening socket
hands it. `guarded_protocol` adds, per connection:
- a cap: past `max_connections` open at once, a new connection is closed as soon as it is accepted (its file
  descriptor comes straight back), so descriptors stay bounded whatever clients do;
- a header deadline: a connection must send a request's whole header block within `header_timeout_s` of opening
  (or of its first byte after a previous response), else it is closed;
- a body deadline: a request's whole body must arrive within `body_timeout_s` of its headers.
A response, however long it streams, has no deadline.

`quiet_loop_errors` makes the event loop log a repeated error (an accept that fails for want of descriptors, say)
once per `interval_s` with a count, not once per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("wisp.server")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections must be >= 1, got {self.max_connections}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class _Throttled:
    """Logs a message at most once per `interval_s` (with how many were held back)."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s, self.last, self.held = interval_s, {}, {}

    def __call__(self, key: str, message: str, *args) -> None:
        now = time.monotonic()
        if now - self.last.get(key, -self.interval_s) < self.interval_s:
            self.held[key] = self.held.get(key, 0) + 1
            return
        held, self.held[key], self.last[key] = self.held.get(key, 0), 0, now
        log.warning(message + (f" ({held} more like it since the last report)" if held else ""), *args)


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with `limits` (see the module docstring); pass it as uvicorn.Config(http=...)."""
    warn = _Throttled()

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            self._deadline: asyncio.TimerHandle | None = None
            self._waiting_for = None
            if len(self.connections) >= limits.max_connections:
                self.transport = transport  # (connection_lost closes it again)
                transport.abort()
                warn("cap", "connection refused: %d connections are open, the cap (--max-connections)",
                     len(self.connections))
                return
            super().connection_made(transport)
            self._arm(h11.IDLE)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            self._arm(state if state in (h11.IDLE, h11.SEND_BODY) else None)

        def connection_lost(self, exc) -> None:
            self._arm(None)
            super().connection_lost(exc)

        def _arm(self, waiting_for) -> None:
            """Keep one deadline for what the client still owes: headers (IDLE), a body (SEND_BODY), or none."""
            if waiting_for is self._waiting_for:
                return
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._waiting_for = None, waiting_for
            if waiting_for is not None and not self.transport.is_closing():
                seconds = limits.header_timeout_s if waiting_for is h11.IDLE else limits.body_timeout_s
                self._deadline = self.loop.call_later(seconds, self._too_slow, seconds)

        def _too_slow(self, seconds: float) -> None:
            what = "headers" if self._waiting_for is h11.IDLE else "body"
            self._deadline = None
            if not self.transport.is_closing():
                warn("slow", "closed a connection whose request %s took over %.0f s", what, seconds)
                self.transport.abort()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # uvicorn's keep-alive timer now watches the idle connection
            self._arm(None)

    return GuardedH11Protocol


def quiet_loop_errors(loop: asyncio.AbstractEventLoop, interval_s: float = 10.0) -> None:
    """The loop logs each kind of error (by its message) at most once per `interval_s`, with a count."""
    throttled = _Throttled(interval_s)

    def handler(loop, context: dict) -> None:
        message = str(context.get("message", "event loop error"))
        exc = context.get("exception")
        throttled(message, "%s%s", message, f": {exc!r}" if exc is not None else "")

    loop.set_exception_handler(handler)
