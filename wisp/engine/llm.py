"""`LLM`: the offline Python API, a thin driver of `LLMEngine` (batched, paged KV, prefix cache).

Every op in the model is row-invariant and attention is exact per token, so a request's tokens do not
depend on its batch mates, on scheduling, on prefix-cache hits, or on the expert mode.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Sequence

import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.tokenizer import require
from wisp.errors import WispError

Prompt = str | Sequence[int]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)  # generated only
    text: str = ""
    finish_reason: str | None = None  # "stop", "length", or "error" (its own step failed; see `error`)
    logits: list[torch.Tensor] | None = None  # per generated token, float32 [V], when asked for
    arrival_time: float = 0.0  # time.perf_counter() when the engine accepted it
    first_token_time: float | None = None
    finish_time: float | None = None
    error: str | None = None  # why it finished with "error" (`wisp.engine.request_failure`); the others ran on
    logprobs: list | None = None  # per generated token (`TokenLogprobs`), when its params asked for them


class LLM:
    def __init__(
        self,
        model: str,
        device: str = "auto",
        mode: str = "paged",
        expert_cap: int | None = None,
        dtype=None,
        **engine_options,
    ):
        """engine_options: any other EngineConfig field (kv_blocks, kv_bytes, max_concurrency, max_model_len, ...)."""
        self.engine = LLMEngine(
            EngineConfig(model=str(model), device=device, mode=mode, expert_cap=expert_cap, dtype=dtype, **engine_options)
        )
        self.config = self.engine.model_config
        self.expert_cap = self.engine.expert_cap
        self.tokenizer = self.engine.tokenizer
        self.model = self.engine.model
        self._ids = itertools.count()

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return require(self.tokenizer, self.engine.path).encode(prompt)
        try:
            return [operator.index(t) for t in prompt]
        except TypeError:
            raise WispError(f"prompt token ids must be integers, got {list(prompt)[:8]!r}") from None

    def generate(
        self,
        prompts: Sequence[Prompt] | Prompt,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        return_logits: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise WispError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        encoded = [self.encode(p) for p in prompts]
        for ids in encoded:  # validate all before running any
            self.engine.validate_prompt(ids)
        rids = [f"llm-{next(self._ids)}" for _ in encoded]
        seqs = []
        try:
            for rid, ids, p in zip(rids, encoded, plist):
                self.engine.add_request(rid, ids, p, strict_length=False, keep_logits=return_logits)
                seqs.append(self.engine.requests[rid])
            while self.engine.has_unfinished():
                self.engine.step()
        except BaseException:  # an error or Ctrl-C must not leave this call's requests in the engine
            for rid in rids:
                self.engine.abort_request(rid)
            raise
        return [
            RequestOutput(
                s.prompt_ids, s.output_ids, s.text, s.finish_reason, s.logits, s.arrival_time, s.first_token_time, s.finish_time,
                None if s.failure is None else s.failure.message, s.output_logprobs,
            )
            for s in seqs
        ]

    def prompt_logits(self, prompt: Prompt) -> torch.Tensor:
        """Logits [T, V] (float32) at every prompt position, as a teacher-forced forward gives them."""
        return self.engine.prompt_logits(self.encode(prompt))

    def stats(self) -> dict:
        return self.engine.stats()

    def reset_stats(self) -> None:
        self.engine.reset_stats()
