"""A soak's clients: good requests (completions and chat, streamed or not, some hung up on), bad ones that
must each get a 4xx, and the tally of every outcome."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter

import httpx
import openai

from wisp.bench.soak.config import SoakConfig

WORDS = ("expert", "cache", "token", "block", "router", "layer", "budget", "stream", "probe", "slot", "byte",
         "the", "a", "of", "and", "to", "with", "while", "resize", "serve")
SHARED_PREFIX = "You are a helpful assistant running inside a soak test. Answer briefly. "


class Tally:
    """Outcomes of every request, thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()  # (kind, outcome) -> count
        self.statuses: Counter = Counter()  # HTTP status -> count
        self.server_errors: list[dict] = []  # the 5xx, with what was sent
        self.unexpected: list[dict] = []  # anything else that should not happen (first 50)
        self.sent = 0

    def take(self, limit: int) -> bool:
        with self.lock:
            if self.sent >= limit:
                return False
            self.sent += 1
            return True

    def add(self, kind: str, outcome: str, status: int | None = None, detail: dict | None = None) -> None:
        with self.lock:
            self.outcomes[(kind, outcome)] += 1
            if status is not None:
                self.statuses[status] += 1
                if status >= 500:
                    self.server_errors.append({"kind": kind, "status": status, **(detail or {})})
            if outcome.startswith("unexpected") and len(self.unexpected) < 50:
                self.unexpected.append({"kind": kind, "outcome": outcome, **(detail or {})})


def bad_requests(model: str, floor_blocks: int) -> list[tuple[str, str, str, dict | None, bytes | None]]:
    """(name, method, path, json body, raw body): each must be answered with a 4xx."""
    ok = {"model": model, "prompt": "Hello", "max_tokens": 4}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return [
        ("bad_json", "POST", "/v1/completions", None, b'{"model": "x", "prompt": '),
        ("prompt_type", "POST", "/v1/completions", {**ok, "prompt": {"a": 1}}, None),
        ("max_tokens_type", "POST", "/v1/completions", {**ok, "max_tokens": "lots"}, None),
        ("unknown_model", "POST", "/v1/completions", {**ok, "model": "no-such-model"}, None),
        ("surrogate_prompt", "POST", "/v1/completions", None,
         json.dumps(ok).replace('"Hello"', '"a\\ud800b"').encode()),
        ("surrogate_chat", "POST", "/v1/chat/completions", None,
         json.dumps(chat).replace('"Hi"', '"\\udfff"').encode()),
        ("temperature_underflow", "POST", "/v1/completions", {**ok, "temperature": 1e-50}, None),
        ("top_p_underflow", "POST", "/v1/chat/completions", {**chat, "top_p": 1e-50}, None),
        ("too_long", "POST", "/v1/completions", {**ok, "max_tokens": 10**6}, None),
        ("n_2", "POST", "/v1/completions", {**ok, "n": 2}, None),
        ("messages_type", "POST", "/v1/chat/completions", {**chat, "messages": "Hi"}, None),
        ("token_out_of_vocab", "POST", "/v1/completions", {**ok, "prompt": [1, 10**9]}, None),
        ("oversized_body", "POST", "/v1/completions", {**ok, "prompt": "x" * 100_000}, None),
        ("unknown_route", "GET", "/v1/nothing-here", None, None),
        ("resize_under_floor", "POST", "/admin/resize", {"kv_blocks": max(1, floor_blocks - 1)}, None),
    ]


class Traffic:
    def __init__(self, cfg: SoakConfig, base: str, tokenizer: bool, floor_blocks: int):
        self.cfg, self.base, self.tokenizer = cfg, base, tokenizer
        self.tally = Tally()
        self.bad = bad_requests(cfg.model, floor_blocks)
        self.stop = threading.Event()

    def client(self, timeout: float = 120.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="soak", max_retries=0, timeout=timeout)

    def prompt(self, rng: random.Random):
        if not self.tokenizer:
            return [rng.randrange(1, 200) for _ in range(rng.randint(4, 120))]
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
        return (SHARED_PREFIX if rng.random() < 0.5 else "") + words

    def run_client(self, index: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + index)
        disconnects = index % 3 == 0  # a third of the clients hang up
        client = self.client()
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while not self.stop.is_set() and self.tally.take(self.cfg.max_requests):
                if rng.random() < self.cfg.bad_fraction:
                    self.send_bad(http, rng)
                    continue
                chat = self.tokenizer and rng.random() < 0.5
                stream = rng.random() < 0.5
                kind = ("chat" if chat else "completion") + ("_stream" if stream else "")
                try:
                    self.send_good(client, rng, kind, chat, stream, disconnects)
                except openai.APIStatusError as exc:
                    outcome = "5xx" if exc.status_code >= 500 else "unexpected_4xx"
                    self.tally.add(kind, outcome, exc.status_code, {"message": str(exc)[:300]})
                except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                    self.tally.add(kind, "unexpected_transport_error", None, {"message": repr(exc)[:300]})
                except Exception as exc:  # the client's own parsing, an SSE error event, ...
                    self.tally.add(kind, "unexpected_error", None, {"message": repr(exc)[:300]})

    def send_good(self, client, rng, kind: str, chat: bool, stream: bool, disconnects: bool) -> None:
        max_tokens = rng.randint(*self.cfg.max_tokens)
        temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
        extra = {"seed": rng.randrange(1 << 20)} if temperature else {}
        if chat:
            messages = [{"role": "user", "content": self.prompt(rng)}]
            if rng.random() < 0.3:
                messages = [{"role": "system", "content": "Be terse."}, *messages]
            call = lambda c, **kw: c.chat.completions.create(model=self.cfg.model, messages=messages,  # noqa: E731
                                                             max_tokens=max_tokens, temperature=temperature, **extra, **kw)
        else:
            prompt = self.prompt(rng)
            call = lambda c, **kw: c.completions.create(model=self.cfg.model, prompt=prompt, max_tokens=max_tokens,  # noqa: E731
                                                        temperature=temperature, **extra, **kw)
        if stream:
            hang_up_after = rng.randint(1, max(1, max_tokens // 2)) if disconnects else None
            chunks = 0
            finish = None
            events = call(client, stream=True)
            try:
                for chunk in events:
                    chunks += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    if hang_up_after is not None and chunks >= hang_up_after and finish is None:
                        break
            finally:
                events.close()
            if finish is None and hang_up_after is not None:
                self.tally.add(kind, "disconnected", 200)
            elif finish in ("stop", "length"):
                self.tally.add(kind, "ok", 200)
            else:
                self.tally.add(kind, "unexpected_finish", 200, {"finish_reason": finish, "chunks": chunks})
            return
        if disconnects and rng.random() < 0.3:  # hang up before the answer: a short read timeout
            try:
                with self.client(timeout=rng.uniform(0.02, 0.3)) as short:
                    out = call(short)
            except openai.APITimeoutError:
                self.tally.add(kind, "disconnected")
                return
        else:
            out = call(client)
        finish = out.choices[0].finish_reason
        self.tally.add(kind, "ok" if finish in ("stop", "length") else "unexpected_finish", 200,
                       {"finish_reason": finish})

    def send_bad(self, http: httpx.Client, rng: random.Random) -> None:
        name, method, path, body, raw = rng.choice(self.bad)
        kind = "bad:" + name
        try:
            if raw is not None:
                resp = http.request(method, path, content=raw, headers={"Content-Type": "application/json"})
            else:
                resp = http.request(method, path, json=body)
        except httpx.TransportError as exc:
            self.tally.add(kind, "unexpected_transport_error", None, {"message": repr(exc)[:300]})
            return
        status = resp.status_code
        if 400 <= status < 500:
            outcome = "4xx"
        elif status >= 500:
            outcome = "5xx"
        else:
            outcome = "unexpected_accepted"
        self.tally.add(kind, outcome, status, {"body": resp.text[:300]} if outcome != "4xx" else None)
