"""A stand-in for `LLMEngine` with its interface, for the server's unit tests (no torch model).

It has a byte tokenizer (ids 0-255 are bytes, 256 is EOS), a scripted "model" whose next token depends
only on the request's own prompt and tokens so far, a FIFO waiting queue under a running limit, a block
pool whose blocks are used, cached (freed but reusable) or free, stop strings, a poisoned request (a
prompt containing "<fail>" fails on its own at its second token, as `LLMEngine` finishes a request whose
sampling raised: finish_reason "error"), and an assertion that every engine call comes from one thread
(the AsyncEngine's).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

from wisp.errors import WispError
from wisp.models.demo import DEMO_CHAT_TEMPLATE

EOS = 256
VOCAB = 259
SCRIPT = b"the quick brown fox jumps over the lazy dog. "


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    error: str | None = None
    logprobs: list | None = None


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def scripted_text(prompt_ids: list[int], n: int) -> str:
    """What the fake model writes for a prompt (absent EOS and stops): a rotation of SCRIPT."""
    start = sum(prompt_ids) % len(SCRIPT)
    return bytes(SCRIPT[(start + i) % len(SCRIPT)] for i in range(n)).decode()


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    params: object
    tokens: list[int] = field(default_factory=list)
    blocks: int = 0


class FakeEngine:
    def __init__(self, max_model_len: int = 128, max_concurrency: int = 2, num_blocks: int = 64, block_size: int = 4,
                 step_delay: float = 0.0, sampling_defaults: tuple[tuple[str, float], ...] = ()):
        self.tokenizer = ByteTokenizer()
        self.model_config = SimpleNamespace(family="qwen3_moe", sampling_defaults=sampling_defaults)
        self.grammars = None  # no grammar engine: constrained requests get a 400 here
        self.chat_template = DEMO_CHAT_TEMPLATE
        self.special_tokens = {"eos_token": "<|endoftext|>"}
        self.max_model_len = max_model_len
        self.max_concurrency = max_concurrency
        self.block_size = block_size
        self.step_delay = step_delay
        self.fail_steps = 0  # make the next N steps raise
        self.total, self.used, self.cached = num_blocks, 0, 0
        self.peak = 0
        self.waiting: deque[_Req] = deque()
        self.running: dict[str, _Req] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self.tokens_prefilled = self.tokens_decoded = 0  # as LLMEngine counts them (the async loop reads them)
        self._owner: int | None = None

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        assert me == self._owner, "engine called from two threads"

    # -- the LLMEngine interface ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params, constraint=None) -> None:
        self._check_thread()
        if request_id in self.running or any(r.request_id == request_id for r in self.waiting):
            raise WispError(f"duplicate request id {request_id}")
        if any(not 0 <= t < VOCAB for t in prompt_ids):
            raise WispError(f"token id out of the vocabulary [0, {VOCAB})")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            raise WispError(f"prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) > {self.max_model_len}")
        if math.ceil(total / self.block_size) > self.total:
            raise WispError(f"request needs more than the pool's {self.total} blocks")
        self.waiting.append(_Req(request_id, list(prompt_ids), params))

    def abort_request(self, request_id: str) -> None:
        self._check_thread()
        self.aborted.append(request_id)
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)
        req = self.running.pop(request_id, None)
        if req is not None:
            self._release(req)

    def has_unfinished(self) -> bool:
        self._check_thread()
        return bool(self.waiting or self.running)

    def step(self) -> list[StepOutput]:
        self._check_thread()
        self.steps += 1
        if self.fail_steps:
            self.fail_steps -= 1
            raise RuntimeError("injected step failure")
        if self.step_delay:
            time.sleep(self.step_delay)
        self._admit()
        outputs = [self._advance(req) for req in list(self.running.values())]
        self.tokens_decoded += len(outputs)
        return outputs

    def stats(self) -> dict:
        if self._owner is not None:
            self._check_thread()
        return {
            "expert_hits": 10 * self.steps, "expert_misses": self.steps, "expert_evictions": 0, "expert_loads": self.steps,
            "expert_cpu_computed": 0,
            "bytes_h2d": 1000 * self.steps, "hit_rate": 10 / 11 if self.steps else 0.0,
            "kv_blocks_total": self.total, "kv_blocks_used": self.used, "kv_blocks_cached": self.cached,
            "kv_blocks_free": self.total - self.used - self.cached, "kv_peak_blocks_used": self.peak,
            "prefix_hit_tokens": 0, "prefix_miss_tokens": 0, "preemptions": 0,
            "num_running": len(self.running), "num_waiting": len(self.waiting),
        }

    # -- internals ------------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_concurrency:
            req = self.waiting[0]
            need = math.ceil((len(req.prompt) + req.params.max_tokens) / self.block_size)
            if need > self.total - self.used:
                break
            self.waiting.popleft()
            take_free = min(need, self.total - self.used - self.cached)
            self.cached -= need - take_free  # evict cached blocks for the rest
            self.used += need
            self.peak = max(self.peak, self.used)
            req.blocks = need
            self.running[req.request_id] = req

    def _release(self, req: _Req) -> None:
        self.used -= req.blocks
        self.cached += req.blocks
        req.blocks = 0

    def _advance(self, req: _Req) -> StepOutput:
        p = req.params
        n = len(req.tokens)
        if b"<fail>" in bytes(t for t in req.prompt if t < 256) and n == 1:
            del self.running[req.request_id]
            self._release(req)
            return StepOutput(req.request_id, [], list(req.tokens), self.tokenizer.decode(req.tokens), True, "error",
                              len(req.prompt), f"request {req.request_id} failed in its sampling")
        if b"<eos>" in bytes(t for t in req.prompt if t < 256) and n == 2 and not p.ignore_eos:
            token = EOS
        else:
            token = ord(scripted_text(req.prompt, n + 1)[-1])
        req.tokens.append(token)
        text = self.tokenizer.decode(req.tokens)
        reason = None
        for stop in getattr(p, "stop", ()) or ():
            if stop in text:
                text, reason = text[: text.index(stop)], "stop"
        if reason is None and token == EOS:
            reason = "stop"
        if reason is None and len(req.tokens) >= p.max_tokens:
            reason = "length"
        if reason is not None:
            del self.running[req.request_id]
            self._release(req)
        return StepOutput(req.request_id, [token], list(req.tokens), text, reason is not None, reason, len(req.prompt))
