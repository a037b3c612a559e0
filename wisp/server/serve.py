"""Running the app as a process: uvicorn on a pre-bound socket, the ready line, and a clean shutdown.

On SIGINT/SIGTERM uvicorn stops accepting connections and waits for the requests in flight. After
`grace_s` seconds the engine is shut down, which ends every remaining response on its own terms (an
SSE error event then `data: [DONE]`, or a 503), so uvicorn never has to cancel a handler; the app's
lifespan then joins the engine thread and `serve` returns (the process exits 0).
"""

from __future__ import annotations

import asyncio
import signal
import socket

from fastapi import FastAPI

from wisp.engine.async_engine import AsyncEngine
from wisp.server.connections import ConnectionLimits, guarded_protocol, quiet_loop_errors

GRACE_S = 5.0


async def _stop_engine_after(engine: AsyncEngine, delay: float) -> None:
    await asyncio.sleep(delay)
    await asyncio.to_thread(engine.shutdown)


def serve(app: FastAPI, engine: AsyncEngine, sock: socket.socket, ready_line: str, grace_s: float = GRACE_S,
          limits: ConnectionLimits = ConnectionLimits()) -> None:
    """Serve `app` on `sock` (bound, not listening) until SIGINT/SIGTERM; prints `ready_line` once listening.
    `limits`: the connection cap and deadlines (`wisp.server.connections`)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            quiet_loop_errors(asyncio.get_running_loop())
            await super().startup(sockets)
            if self.started:
                print(ready_line, flush=True)

        async def shutdown(self, sockets=None) -> None:
            stopper = asyncio.create_task(_stop_engine_after(engine, grace_s))
            try:
                await super().shutdown(sockets)
            finally:
                stopper.cancel()

    # uvicorn's own deadline is only a backstop: the engine stop above ends every response first
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=grace_s + 10, http=guarded_protocol(limits),
                            timeout_keep_alive=limits.keep_alive_s)
    # uvicorn re-raises the signal that stopped it once it is done; with no-op handlers in place that
    # re-raise does nothing, so a clean shutdown returns normally
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    Server(config).run(sockets=[sock])
