"""Connection limits (`wisp.server.connections`) against a slowloris client on loopback: many connections that send
part of a request and stall. The server must keep its descriptors bounded (the cap), close the stalled ones at
their deadline, keep answering /health on a connection opened before the attack, and take new connections after.

A real uvicorn (h11) serves the app in a thread with the guarded protocol; the attack is bounded in count and time.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from tests.server.helpers import make_app, serve_on_loopback
from wisp.server.connections import ConnectionLimits, guarded_protocol

pytestmark = pytest.mark.slow  # seconds of deadlines

CAP, HEADER_S, BODY_S = 24, 1.0, 1.5


def slow_client(host, port, partial: bytes, hold_s: float, outcome: list) -> None:
    """Send `partial`, then one more byte every 0.2 s for `hold_s`; record when the server closed it (or None)."""
    start = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(partial)
            while time.monotonic() - start < hold_s:
                time.sleep(0.2)
                s.sendall(b"X")
        outcome.append(None)
    except OSError:
        outcome.append(time.monotonic() - start)


@pytest.mark.parametrize("partial, deadline", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ", HEADER_S),  # headers never end
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
     BODY_S),  # a body that trickles
])
def test_a_slowloris_attack_is_capped_and_timed_out_while_health_answers(partial, deadline):
    app, _, _ = make_app()
    limits = ConnectionLimits(max_connections=CAP, header_timeout_s=HEADER_S, body_timeout_s=BODY_S)
    open_at_accept: list[int] = []

    class Counted(guarded_protocol(limits)):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            open_at_accept.append(len(self.connections))  # the server's open connections, this one included

    with serve_on_loopback(app, 30, http=Counted) as (host, port):
        health = http.client.HTTPConnection(host, port, timeout=5)  # opened before the attack, kept alive
        health.request("GET", "/health")
        assert health.getresponse().read() == b'{"status":"ok"}'
        outcomes: list = []
        attackers = [threading.Thread(target=slow_client, args=(host, port, partial, 6.0, outcomes)) for _ in range(60)]
        for t in attackers:
            t.start()
        latencies = []
        while any(t.is_alive() for t in attackers):
            t0 = time.monotonic()
            health.request("GET", "/health")
            response = health.getresponse()
            assert response.status == 200 and response.read() == b'{"status":"ok"}'
            latencies.append(time.monotonic() - t0)
            time.sleep(0.05)
        for t in attackers:
            t.join()
        assert len(outcomes) == 60 and None not in outcomes  # every stalled connection was closed by the server
        assert max(outcomes) < deadline + 3.0  # at its deadline (or at once, past the cap)
        assert max(open_at_accept) == CAP  # never more open than the cap: the rest were closed at accept
        assert max(latencies) < 0.1, sorted(latencies)[-5:]  # measured here: 2-30 ms
        after = http.client.HTTPConnection(host, port, timeout=5)  # a new connection is taken again
        after.request("GET", "/health")
        assert after.getresponse().status == 200


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max connections"):
        ConnectionLimits(max_connections=0)
    with pytest.raises(ValueError, match="header_timeout_s"):
        ConnectionLimits(header_timeout_s=0)


def test_a_repeated_loop_error_is_logged_once_per_interval(caplog):
    """Out of descriptors, every accept fails: 526,238 such tracebacks filled 213 MB of log in 40 s."""
    import asyncio

    from wisp.server.connections import quiet_loop_errors

    loop = asyncio.new_event_loop()
    try:
        quiet_loop_errors(loop, interval_s=60)
        with caplog.at_level("WARNING", logger="wisp.server"):
            for _ in range(1000):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files")})
            loop.call_exception_handler({"message": "another error"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "Too many open files" in lines[0] and lines[1] == "another error"
