"""Hostile input (issue 13, item 2): text that is not valid Unicode, oversized bodies and prompts, slow
tokenization, `param` on every validation error, and the connection after an error.

Most cases go through the TestClient; those about the connection itself run a real uvicorn (h11) over
the app on a loopback port, in a thread, and talk to it through one keep-alive `http.client` connection
or a raw socket.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server.helpers import MODEL, make_app, make_client, serve_on_loopback
from tests.server.test_app import assert_error

SURROGATE_BODIES = [  # (route, body, param): a lone surrogate where wisp reads text
    ("/v1/completions", {"model": MODEL, "prompt": "a\ud800b"}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a\udfffb"]}, "prompt"),
    ("/v1/completions", {"model": "fa\ud800ke", "prompt": "x"}, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["ok", "\ud800"]}, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "user": "\udc00"}, "user"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a\ud800b"}]}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "system", "content": "ok"}, {"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]},
     "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user\ud800", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x", "name": "\ud800"}]},
     "messages"),
    ("/v1/chat/completions", {"model": "\ud800", "messages": [{"role": "user", "content": "x"}]}, "model"),
]


def raw(body: dict) -> bytes:
    """JSON with every non-ASCII character escaped: how a client spells a lone surrogate (\\ud800)."""
    return json.dumps(body).encode("ascii")


def post_raw(client, route: str, body: bytes, **headers):
    return client.post(route, content=body, headers={"content-type": "application/json", **headers})


# -- text that cannot be encoded --------------------------------------------------------------------
@pytest.mark.parametrize("route, body, param", SURROGATE_BODIES)
def test_lone_surrogate_is_400_naming_the_field(served, route, body, param):
    client, fake, _ = served
    err = assert_error(post_raw(client, route, raw(body)), 400, "surrogate", "not valid Unicode")
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert "TypeError" not in err["message"] and "UnicodeEncodeError" not in err["message"]
    assert fake.steps == 0  # refused before the engine saw it
    ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_surrogate_pairs_are_fine(client):
    body = {"model": MODEL, "prompt": "smile \ud83d\ude00", "max_tokens": 2}  # a pair: one valid character
    resp = post_raw(client, "/v1/completions", raw(body))
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == len("smile \U0001F600".encode())


def test_invalid_utf8_body_is_400(client):
    resp = post_raw(client, "/v1/completions", b'{"model": "fake", "prompt": "\xff\xfe"}')
    assert_error(resp, 400, "UTF-8")


# -- no internal text in a 500 ----------------------------------------------------------------------
def test_internal_error_is_generic_and_closes(served, monkeypatch, caplog):
    client, fake, _ = served

    def broken(text: str) -> list[int]:
        raise RuntimeError("secret internals at 0xdeadbeef")

    monkeypatch.setattr(fake.tokenizer, "encode", broken)
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    err = assert_error(resp, 500, "internal error")
    assert "secret" not in resp.text and "RuntimeError" not in resp.text and err["type"] == "server_error"
    assert resp.headers["connection"] == "close"
    assert "secret internals" in caplog.text  # the cause is in the server's log
    monkeypatch.undo()
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}).status_code == 200


# -- body and prompt limits -------------------------------------------------------------------------
def test_body_over_the_limit_is_413():
    client, fake, _ = make_client(max_request_bytes=1000)
    with client:
        body = {"model": MODEL, "prompt": "x" * 2000, "max_tokens": 1}
        resp = client.post("/v1/completions", json=body)
        err = assert_error(resp, 413, "1000 bytes", "--max-request-bytes")
        assert err["code"] == "request_too_large" and resp.headers["connection"] == "close"

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(5):
                yield b" " * 400

        resp = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert_error(resp, 413, "1000 bytes")
        ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 100, "max_tokens": 1})
        assert ok.status_code == 200, ok.text
        assert fake.steps == 1


def test_default_body_limit_is_a_few_mib(client):
    resp = post_raw(client, "/v1/completions", b" " * (4 * 2**20 + 1))
    assert_error(resp, 413, str(4 * 2**20))


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {"prompt": list(range(65, 65 + 128))}, "prompt"),
    ("/v1/completions", {"prompt": "x" * 500, "max_tokens": 5}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 500}], "max_tokens": 5}, "messages"),
])
def test_prompt_filling_the_context_is_400_before_the_engine(served, route, body, param):
    client, fake, _ = served
    err = assert_error(client.post(route, json={"model": MODEL, **body}), 400, "maximum context length is 128",
                       "in the prompt")
    assert err["param"] == param and err["code"] == "context_length_exceeded"
    assert fake.steps == 0


# -- tokenization off the event loop ----------------------------------------------------------------
def test_slow_tokenization_does_not_block_health(served, monkeypatch):
    client, fake, _ = served
    started, release = threading.Event(), threading.Event()
    encode = fake.tokenizer.encode

    def slow(text: str) -> list[int]:
        started.set()
        assert release.wait(10)  # holds its thread, as a huge prompt would
        return encode(text)

    monkeypatch.setattr(fake.tokenizer, "encode", slow)
    with ThreadPoolExecutor(1) as pool:
        slow_request = pool.submit(client.post, "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert started.wait(10)
        t0 = time.monotonic()
        assert client.get("/health").json() == {"status": "ok"}
        ids = client.post("/v1/completions", json={"model": MODEL, "prompt": [72, 105], "max_tokens": 2})
        waited = time.monotonic() - t0
        release.set()
        assert ids.status_code == 200 and slow_request.result(10).status_code == 200
    assert waited < 5 and not slow_request.exception()


# -- param on engine-side validation errors ---------------------------------------------------------
@pytest.mark.parametrize("route, fields, param", [
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"temperature": -1}, "temperature"),
    ("/v1/completions", {"top_p": 0}, "top_p"),
    ("/v1/completions", {"top_k": -1}, "top_k"),
    ("/v1/completions", {"seed": -1}, "seed"),
    ("/v1/completions", {"prompt": [1, 2, 999]}, "prompt"),
    ("/v1/completions", {"prompt": [1, -2]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 200}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 500}, "max_completion_tokens"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"temperature": -0.5}, "temperature"),
])
def test_engine_validation_errors_name_the_field(client, route, fields, param):
    body = {"model": MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}], **fields}
    assert assert_error(client.post(route, json=body), 400)["param"] == param


def test_no_tokenizer_names_the_prompt(served):
    client, fake, _ = served
    fake.tokenizer = None
    err = assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}), 400, "token ids")
    assert err["param"] == "prompt"
    err = assert_error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user",
                                                                                              "content": "x"}]}), 400)
    assert err["param"] == "messages"


# -- the connection after an error (a real HTTP server) ---------------------------------------------
@pytest.fixture(scope="module")
def live():
    """(host, port) of uvicorn serving the app over a FakeEngine, with a 64 KiB body limit."""
    app, _, _ = make_app(max_request_bytes=64 * 1024)
    with serve_on_loopback(app, start_timeout=10) as address:
        yield address


def request(conn: http.client.HTTPConnection, route: str, body: bytes) -> tuple[int, dict, bytes]:
    conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


GOOD = raw({"model": MODEL, "prompt": "Hello", "max_tokens": 3})


@pytest.mark.parametrize("route, body, status", [
    *[(route, raw(body), 400) for route, body, _ in SURROGATE_BODIES[:3] + SURROGATE_BODIES[5:6]],
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", raw({"model": "gpt-9", "prompt": "x"}), 404),
    ("/v1/completions", raw({"model": MODEL, "prompt": "x", "max_tokens": 0}), 400),
])
def test_the_connection_stays_usable_after_a_client_error(live, route, body, status):
    conn = http.client.HTTPConnection(*live, timeout=10)
    try:
        code, headers, payload = request(conn, route, body)
        assert code == status and set(json.loads(payload)) == {"error"}, payload
        assert headers.get("connection") != "close"
        sock = conn.sock
        code, _, payload = request(conn, "/v1/completions", GOOD)
        assert code == 200, payload
        assert conn.sock is sock  # the same keep-alive connection served it
    finally:
        conn.close()


def test_oversized_body_closes_the_connection_cleanly(live):
    with socket.create_connection(live, timeout=10) as s:
        # declares 10 MB, sends a little: the 413 comes back at once and the server closes its end
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n" + b" " * 1000)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), head
    assert json.loads(body)["error"]["code"] == "request_too_large"
    conn = http.client.HTTPConnection(*live, timeout=10)  # the server is fine
    try:
        assert request(conn, "/v1/completions", GOOD)[0] == 200
    finally:
        conn.close()


def test_oversized_body_sent_whole_gets_its_413(live):
    conn = http.client.HTTPConnection(*live, timeout=10)
    try:
        code, headers, payload = request(conn, "/v1/completions", b" " * 2**20)  # 1 MiB, the limit is 64 KiB
        assert code == 413 and headers.get("connection") == "close", payload
        assert request(conn, "/v1/completions", GOOD)[0] == 200  # on a new connection
    finally:
        conn.close()


def test_internal_error_closes_the_connection_with_notice(live, monkeypatch):
    conn = http.client.HTTPConnection(*live, timeout=10)
    try:
        from tests.server.fake_engine import ByteTokenizer

        monkeypatch.setattr(ByteTokenizer, "encode", lambda self, text: 1 / 0)
        code, headers, payload = request(conn, "/v1/completions", GOOD)
        assert code == 500 and headers.get("connection") == "close" and b"ZeroDivision" not in payload
        monkeypatch.undo()
        code, _, payload = request(conn, "/v1/completions", GOOD)  # http.client reconnects, as told
        assert code == 200, payload
    finally:
        conn.close()
