"""`LLM`: load a checkpoint in one expert mode and generate from a batch of prompts.

The loop is prefill (each request alone, so its prompt's computation never depends on its batch)
then batched decode (one token per running request per step, through the shared expert stores).
Every op in the model is row-invariant, so a request's tokens do not depend on its batch mates.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from wisp.config import EngineConfig, ModelConfig, parse_dtype
from wisp.core.counters import sum_counters
from wisp.engine.kv_cache import SequenceKV
from wisp.engine.sampling import Sampler, SamplingParams
from wisp.engine.tokenizer import TextTokenizer, require
from wisp.errors import WispError
from wisp.models.loader import load_model
from wisp.models.moe_decoder import Chunk
from wisp.models.source import resolve_model_path

Prompt = str | Sequence[int]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)  # generated only
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS) or "length"
    logits: list[torch.Tensor] | None = None  # per generated token, float32 [V], when asked for
    arrival_time: float = 0.0  # time.perf_counter() when generate() accepted it
    first_token_time: float | None = None
    finish_time: float | None = None


@dataclass
class _Running:
    out: RequestOutput
    kv: SequenceKV
    sampler: Sampler
    params: SamplingParams
    position: int  # tokens already in the KV cache


class LLM:
    def __init__(self, model: str, device: str = "auto", mode: str = "paged", expert_cap: int | None = None, dtype=None):
        self.engine_config = EngineConfig(model=str(model), device=device, mode=mode, expert_cap=expert_cap, dtype=dtype)
        self.path = resolve_model_path(model)
        cfg = ModelConfig.from_dir(self.path)
        if (override := parse_dtype(dtype)) is not None:
            cfg = replace(cfg, dtype=override)
        self.config = cfg
        self.device = self.engine_config.torch_device()
        self.expert_cap = self.engine_config.resolve_cap(cfg)
        self.model = load_model(self.path, cfg, self.engine_config, self.device)
        self.tokenizer = TextTokenizer.from_dir(self.path)
        self.tokens_prefilled = 0
        self.tokens_decoded = 0

    # -- prompts ------------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = require(self.tokenizer, self.path).encode(prompt)
        else:
            try:
                ids = [operator.index(t) for t in prompt]
            except TypeError:
                raise WispError(f"prompt token ids must be integers, got {list(prompt)[:8]!r}") from None
        if not ids:
            raise WispError("prompt is empty")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise WispError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        limit = self.config.max_position_embeddings
        if len(ids) >= limit:
            raise WispError(f"prompt has {len(ids)} tokens; the model's limit is {limit} (max_position_embeddings)")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    # -- generation ---------------------------------------------------------------------------------
    @torch.inference_mode()
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
        encoded = [self.encode(p) for p in prompts]  # validate all before running any
        arrival = time.perf_counter()
        running = [self._prefill(ids, p, return_logits, arrival) for ids, p in zip(encoded, plist)]
        active = [r for r in running if r.out.finish_reason is None]
        while active:
            self._decode_step(active)
            active = [r for r in active if r.out.finish_reason is None]
        for r in running:
            r.out.text = self.decode(r.out.token_ids)
        return [r.out for r in running]

    def _prefill(self, ids: list[int], params: SamplingParams, return_logits: bool, arrival: float) -> _Running:
        cfg = self.config
        max_len = min(len(ids) + params.max_tokens, cfg.max_position_embeddings)
        kv = SequenceKV(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_len, cfg.dtype, self.device)
        out = RequestOutput(list(ids), logits=[] if return_logits else None, arrival_time=arrival)
        r = _Running(out, kv, Sampler(params), params, 0)
        hidden = self.model.forward(torch.tensor(ids, device=self.device), [Chunk(kv, 0, len(ids))])
        r.position = len(ids)
        self.tokens_prefilled += len(ids)
        self._accept(r, self.model.logits(hidden[-1:])[0])
        return r

    def _decode_step(self, active: list[_Running]) -> None:
        tokens = torch.tensor([r.out.token_ids[-1] for r in active], device=self.device)
        chunks = [Chunk(r.kv, r.position, 1) for r in active]
        logits = self.model.logits(self.model.forward(tokens, chunks))
        self.tokens_decoded += len(active)
        for r, row in zip(active, logits):
            r.position += 1
            self._accept(r, row)

    def _accept(self, r: _Running, logits: torch.Tensor) -> None:
        token = r.sampler(logits)
        out = r.out
        now = time.perf_counter()  # the sampler read the logits back, so the device work is done
        if out.first_token_time is None:
            out.first_token_time = now
        out.token_ids.append(token)
        if out.logits is not None:
            out.logits.append(logits.cpu())
        if token in self.config.eos_token_ids and not r.params.ignore_eos:
            out.finish_reason = "stop"
        elif len(out.token_ids) >= r.params.max_tokens or r.position >= r.kv.max_len:
            out.finish_reason = "length"
        if out.finish_reason is not None:
            out.finish_time = now

    @torch.inference_mode()
    def prompt_logits(self, prompt: Prompt) -> torch.Tensor:
        """Logits [T, V] (float32) at every prompt position, as a teacher-forced forward gives them."""
        ids = self.encode(prompt)
        cfg = self.config
        kv = SequenceKV(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, len(ids), cfg.dtype, self.device)
        hidden = self.model.forward(torch.tensor(ids, device=self.device), [Chunk(kv, 0, len(ids))])
        return self.model.logits(hidden)

    # -- counters -----------------------------------------------------------------------------------
    def stats(self) -> dict:
        stores = self.model.experts
        total = sum_counters(s.counters for s in stores.values())
        routed = total.hits + total.misses
        tokens = self.tokens_prefilled + self.tokens_decoded
        return {
            "mode": self.engine_config.mode,
            "expert_cap": self.expert_cap,
            "expert_hits": total.hits,
            "expert_misses": total.misses,
            "expert_evictions": total.evictions,
            "expert_loads": total.loads,
            "bytes_h2d": total.bytes_h2d,
            "moe_steps": total.steps,
            "hit_rate": total.hits / routed if routed else 0.0,
            "tokens_prefilled": self.tokens_prefilled,
            "tokens_decoded": self.tokens_decoded,
            "bytes_h2d_per_token": total.bytes_h2d / tokens if tokens else 0.0,
            "expert_device_bytes": sum(s.device_bytes for s in stores.values()),
            "per_layer": {str(li): s.counters.as_dict() for li, s in stores.items()},
        }

    def reset_stats(self) -> None:
        for s in self.model.experts.values():
            s.counters.reset()
        self.tokens_prefilled = self.tokens_decoded = 0
