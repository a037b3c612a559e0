"""End to end: `python -m wisp serve --model demo` as a subprocess on a free port, called with the
official `openai` client (and httpx for what the client cannot send), as a user would.

One server for the module (started with --api-key, and a 32-token step budget, so every prompt here is
prefilled in chunks beside other requests' decodes; its outputs are still compared with an `LLM` run). The tests run in file order: the last one sends
SIGTERM while a stream is in flight and checks the process exits 0 within the graceful period.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from tests.server.live_server import demo_server
from wisp import LLM, SamplingParams

pytestmark = pytest.mark.slow  # a live `wisp serve` subprocess

API_KEY = "sk-wisp-test"
PREFIX = "The quick brown fox jumps over the lazy dog. "  # > one 16-token block: concurrent prompts share it
PROMPTS = [PREFIX + f"Question {i}: what is {i} + {i}?" for i in range(8)]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "wisp-cache"  # conftest's demo cache: written once per session
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with demo_server(cache, log, "--max-num-batched-tokens", "32", api_key=API_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (OMP_NUM_THREADS=1); two threads on a busy 2-core box crawl
    try:
        with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test WISP_CACHE
            mp.setenv("WISP_CACHE", str(tmp_path_factory.getbasetemp() / "wisp-cache"))
            llm = LLM("demo", device="cpu")
        return [o.text for o in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))]
    finally:
        torch.set_num_threads(threads)


def test_ready_line_sampling_defaults_and_models(server):
    log = server.log.read_text()
    assert f"wisp: serving demo on {server.base}\n" in log
    assert "wisp: sampling defaults from the model's generation_config: {'temperature': 0.8, 'top_p': 0.95}" in log
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["demo"]


def test_completion_chat_and_streaming(server):
    client = server.client()
    done = client.completions.create(model="demo", prompt="Hello", max_tokens=8, temperature=0)
    assert done.usage.prompt_tokens == 5 and done.usage.completion_tokens == done.usage.total_tokens - 5
    streamed = client.completions.create(model="demo", prompt="Hello", max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens

    text = done.choices[0].text
    stop = next((c for c in text[1:] if c.isascii() and c.isprintable()), None)
    if stop is not None:  # the demo writes random bytes: stop at the first printable ASCII one
        cut = client.completions.create(model="demo", prompt="Hello", max_tokens=8, temperature=0, stop=[stop])
        assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="demo", prompt="Hello", max_tokens=8, temperature=0.9, seed=7)
               for _ in range(2)]
    assert sampled[0].choices[0].text == sampled[1].choices[0].text

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
    chat = client.chat.completions.create(model="demo", messages=messages, max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("stop", "length")
    parts = list(client.chat.completions.create(model="demo", messages=messages, max_tokens=10, temperature=0,
                                                stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_concurrent_greedy_equals_llm_generate(server, reference):
    client = server.client()

    def complete(prompt: str):
        return client.completions.create(model="demo", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outs = list(pool.map(complete, PROMPTS))
    assert [o.choices[0].text for o in outs] == reference


def test_bad_inputs(server):
    client = server.client()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError, match=r"n must be in \[1, 128\]"):
        client.completions.create(model="demo", prompt="x", n=0)
    with pytest.raises(openai.BadRequestError, match=r"2048 tokens.*2100 tokens \(2000 in the prompt, 100 for"):
        client.completions.create(model="demo", prompt="a" * 2000, max_tokens=100)
    auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    for body in (b"{oops", b'{"model": "demo", "prompt": "x", "max_tokens": "5"}'):
        resp = httpx.post(server.base + "/v1/completions", content=body, headers=auth, timeout=10)
        assert resp.status_code == 400 and set(resp.json()["error"]) == {"message", "type", "param", "code"}


def _one_random_request(client: openai.OpenAI, seed: int) -> str:
    rng = random.Random(seed)
    kind = rng.choice(["completion", "chat", "stream", "stream_chat", "abandon", "abandon_chat", "timeout", "bad"])
    text = rng.choice(["", PREFIX, PREFIX + "Again: "]) + "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(1, 40)))
    kw = dict(model="demo", max_tokens=rng.randint(1, 24), temperature=rng.choice([0.0, 0.7, 1.0]),
              top_p=rng.choice([1.0, 0.9]), seed=rng.randint(0, 10**6))
    if rng.random() < 0.2:
        kw["stop"] = [rng.choice("abcdefgh")]
    chat = kind.endswith("chat")
    create = client.chat.completions.create if chat else client.completions.create
    payload = {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    if kind == "bad":
        with pytest.raises(openai.BadRequestError):
            create(**payload, **kw, n=200)
    elif kind == "timeout":  # the client gives up on a non-streamed request
        try:
            client.with_options(timeout=0.01).completions.create(**payload, **kw)
        except openai.APITimeoutError:
            pass
    elif kind.startswith("abandon"):  # read one chunk, then hang up
        stream = create(**payload, **{**kw, "max_tokens": 200}, stream=True)
        next(iter(stream))
        stream.close()
    elif kind.startswith("stream"):
        for _ in create(**payload, **kw, stream=True):
            pass
    else:
        out = create(**payload, **kw)
        assert out.usage.completion_tokens <= kw["max_tokens"]
    return kind


def test_randomized_requests_leave_no_leak(server, reference):
    client = server.client()
    with ThreadPoolExecutor(8) as pool:
        kinds = list(pool.map(lambda s: _one_random_request(client, s), range(150)))
    assert len(set(kinds)) == 8
    deadline = time.monotonic() + 15
    while True:
        m = server.metrics()
        settled = m["wisp_kv_blocks_used"] == 0 and m["wisp_requests_running"] == 0 and m["wisp_requests_waiting"] == 0
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert settled, m
    assert m["wisp_kv_blocks_free"] + m["wisp_kv_blocks_cached"] == m["wisp_kv_blocks_capacity"]
    assert m["wisp_time_to_first_token_seconds_count"] > 0 and m["wisp_inter_token_latency_seconds_count"] > 0
    assert m["wisp_prefix_cache_hit_tokens_total"] > 0
    assert m["wisp_requests_finished_total{finish_reason=abort}"] > 0  # the abandoned streams were cut short
    # still exact after the storm (and now with a warm prefix cache)
    again = client.completions.create(model="demo", prompt=PROMPTS[3], max_tokens=MAX_TOKENS, temperature=0)
    assert again.choices[0].text == reference[3]


def test_a_prompt_of_megabytes_stalls_neither_health_nor_a_stream(server):
    """A 3.9 MB text prompt (under the 4 MiB body limit) once held /health for 6.45 s and a running stream for
    6.9 s: the tokenizer held the GIL in the server's process. Now it encodes in a worker process, and pieces of
    the text prove it over the context at once."""
    health: list[float] = []
    gaps: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                t = time.monotonic()
                assert http.get(server.base + "/health").status_code == 200
                health.append(time.monotonic() - t)
                time.sleep(0.01)

    def stream() -> None:
        last = time.monotonic()
        for _ in server.client().completions.create(model="demo", prompt="Hello", max_tokens=64, temperature=0,
                                                    stream=True):
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    with ThreadPoolExecutor(2) as pool:
        polling, streaming = pool.submit(poll_health), pool.submit(stream)
        time.sleep(0.3)
        big = httpx.post(server.base + "/v1/completions", timeout=120, headers={"Authorization": f"Bearer {API_KEY}"},
                         json={"model": "demo", "prompt": "word " * 780_000, "max_tokens": 4})
        streaming.result(timeout=120)
        stop.set()
        polling.result(timeout=60)
    assert big.status_code == 400 and big.json()["error"]["code"] == "context_length_exceeded", big.text
    assert "the prompt alone has at least" in big.json()["error"]["message"]  # counted only that far
    assert len(health) > 5 and max(health) < 1.0, sorted(health)[-5:]
    assert max(gaps[1:], default=0) < 1.0, sorted(gaps)[-5:]


def test_sigterm_exits_cleanly(server):
    client = server.client()
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Go on"}],
                                            max_tokens=1800, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})  # outlasts the grace period
    chunks = iter(stream)
    next(chunks)
    errors: list[Exception] = []

    def drain() -> None:
        try:
            for _ in chunks:
                pass
        except openai.APIError as exc:  # the server ended the stream after its grace period
            errors.append(exc)

    drained = threading.Thread(target=drain, daemon=True)
    drained.start()
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        rc = server.proc.wait(timeout=20)
    finally:
        drained.join(5)
    assert rc == 0, server.log.read_text()
    assert time.monotonic() - start < 12
    assert not drained.is_alive() and len(errors) == 1 and "shutting down" in str(errors[0]), errors
    assert "Traceback" not in server.log.read_text() and "ERROR" not in server.log.read_text(), server.log.read_text()
