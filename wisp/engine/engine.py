"""LLMEngine: one loop of scheduler.schedule() -> runner.run() -> scheduler.postprocess().

The scheduler picks each step's tokens and, after it, advances and finishes the requests; the
`ModelRunner` computes the step (eagerly or as a CUDA graph) and samples. The engine owns the requests
by id, the model, the KV cache tensors, the block pool, the scheduler and the runner, sized and validated at start:
the engine refuses to start unless the pool holds the admission floor, max_concurrency (W) x
ceil(max_model_len (L) / block_size) blocks, and says in one line how many bytes it has and needs. A device
out-of-memory while it starts is one WispError too, with the bytes needed and a budget that fits
(`wisp.engine.load_oom`).

A request whose own part of a step fails (its sampling, or its stop check and detokenization) is finished
alone with finish_reason "error" and its blocks released; the step goes on for the others
(`wisp.engine.request_failure`). Only a failure of the shared forward raises from `step`.

Not thread-safe: one thread calls add_request / abort_request / step (the server runs it in its own).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from wisp.config import EngineConfig, ModelConfig, parse_dtype
from wisp.core.experts.store import sync_all_counters
from wisp.core.experts.prefetch import CrossLayerPrefetch
from wisp.engine.block_pool import BlockPool
from wisp.engine.detokenizer import IncrementalDetokenizer
from wisp.engine.engine_stats import engine_stats
from wisp.engine.kv_cache import KVCache
from wisp.engine.load_oom import DeviceBytes, oom_message, usable_bytes
from wisp.engine.live_split import LiveSplit
from wisp.engine.load_control.attach import load_control_for
from wisp.engine.routing_feed import RoutingFeed
from wisp.engine.resize_timings import ResizeClock, ResizeTimings
from wisp.engine.model_runner import ModelRunner
from wisp.engine.grammar import Grammars
from wisp.engine.sampling import SamplingParams, TokenConstraint, TokenLogprobs, token_logprobs
from wisp.engine.scheduler import Scheduler
from wisp.engine.sequence import Sequence
from wisp.engine.tokenizer import TextTokenizer
from wisp.errors import InvalidParameter, WispError
from wisp.models.gguf_file import is_gguf
from wisp.models.gguf_reader import GGUFCheckpoint
from wisp.models.gguf_tokenizer import gguf_tokenizer_folder
from wisp.models.loader import CheckpointReader, HostMemory, load_model
from wisp.models.random_checkpoint import RandomWeights
from wisp.models.source import cache_dir, model_source
from wisp.models.token_embedding import embedding_on_host


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    token_ids: list[int]  # all generated so far
    text: str  # all text so far, cut at a matched stop string
    finished: bool
    finish_reason: str | None  # "stop", "length", "abort", or "error" (its own step failed: `error` says how)
    prompt_tokens: int
    error: str | None = None  # for finish_reason "error": a message for the client (`RequestFailure.message`)
    logprobs: list[TokenLogprobs] | None = None  # per generated token so far, when the request asked for them


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.path, cfg = model_source(config)
        if (override := parse_dtype(config.dtype)) is not None:
            cfg = replace(cfg, dtype=override)
        self.model_config = cfg
        self.device = config.torch_device()
        config.resolve_backend("moe", self.device)  # fail before loading anything
        self.expert_cap = config.resolve_cap(cfg) if config.per_layer_caps is None else max(config.per_layer_caps)
        self.max_model_len = config.resolve_max_model_len(cfg)
        self.block_bytes = KVCache.block_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, config.kv_block_size,
                                               cfg.dtype, cfg.kv_tensors)
        self.floor_blocks = config.max_concurrency * -(-self.max_model_len // config.kv_block_size)
        num_blocks = self._pool_blocks()  # refuse a too-small pool before loading anything
        tokenizer_dir = self.path
        if self.path is not None and is_gguf(self.path):  # its tokenizer, from the file's metadata
            tokenizer_dir = gguf_tokenizer_folder(self.path, cache_dir())
        self.tokenizer = TextTokenizer.from_dir(tokenizer_dir) if tokenizer_dir else None
        self.chat_template, self.special_tokens = _tokenizer_config(tokenizer_dir) if tokenizer_dir else (None, {})
        self.grammars = None if self.tokenizer is None else Grammars(self.tokenizer.path, cfg.vocab_size,
                                                                      list(cfg.eos_token_ids))
        self.requests: dict[str, Sequence] = {}
        self.live_split = None  # the online split controller, when one is registered
        self.feed: RoutingFeed | None = None  # every step's routing, per request (`subscribe_routing`)
        self.runner = None
        self._load(num_blocks)

    def _load(self, num_blocks: int) -> None:
        """Load the weights, build the pools and capture the graphs; a device out-of-memory on the way is
        one WispError with the bytes this configuration needs and a budget that would fit
        (`wisp.engine.load_oom`). Pinning that failed leaves the engine on pageable memory (pin_memory off)."""
        config, cfg, stage = self.config, self.model_config, "loading the weights"
        host = HostMemory.for_engine(cfg, config, self.device)
        try:
            self.model = load_model(_weights(config, cfg, self.path, self.device), cfg, config, self.device, host)
            if host.fell_back:
                self.config = replace(self.config, pin_memory=False)
            if config.prefetch:
                stores = [self.model.experts[li] for li in cfg.moe_layer_ids]
                self.prefetch = CrossLayerPrefetch(stores, cfg.num_experts, cfg.top_k)
            stage = "allocating the KV pool"
            self._build_pools(num_blocks)
            self.load_control = load_control_for(self)
            if self.load_control is not None:
                self.scheduler.decode_gate = self.load_control.gate
            stage = "capturing CUDA graphs"
            self.runner.capture_graphs()
            return
        except torch.OutOfMemoryError as exc:  # torch.cuda.OutOfMemoryError is the same class
            cause = " ".join(str(exc).split())[:200]
        # outside the handler, so the traceback no longer holds the partly loaded tensors
        self.model = self.kv = self.runner = None
        need = DeviceBytes.of(cfg, config, num_blocks, self.floor_blocks, self.block_bytes,
                              embedding_on_host(config.embedding, self.device, cfg.tie_word_embeddings, config.pin_memory))
        raise WispError(oom_message(cfg, config, need, usable_bytes(self.device), stage, cause))

    def _build_pools(self, num_blocks: int) -> None:
        """The KV tensors, the block pool over them, the scheduler of that pool and the runner."""
        c, cfg = self.config, self.model_config
        self.kv = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, c.kv_block_size, num_blocks, cfg.dtype,
                          self.device, attention=c.resolve_backend("attention", self.device), keys_only=cfg.kv_tensors == 1,
                          value_dim=cfg.mla.kv_lora_rank if cfg.mla is not None else None)
        self.pool = BlockPool(num_blocks, c.kv_block_size)
        self.scheduler = Scheduler(self.pool, c.max_concurrency, c.max_num_batched_tokens, c.enable_prefix_caching)
        self.runner = ModelRunner(self.model, self.kv, self.pool, c, self.max_model_len)

    def subscribe_routing(self, subscriber, layers: list[int] | None = None):
        """Hand `subscriber(rows, owners)` every step's routing at `layers` (MoE layer ids; None: all) from now on,
        per request (`wisp.engine.routing_feed`; the load controller and the live split read it).
        Returns the call that stops it. Graphs captured before re-capture when the feed logs more layers."""
        if self.feed is None:
            c, cfg = self.config, self.model_config
            self.feed = RoutingFeed(cfg.moe_layer_ids, cfg.top_k, self.device, c.max_num_batched_tokens + c.max_concurrency)
            self.model.routing_log = self.feed
        stop, grew = self.feed.subscribe(subscriber, layers)
        if grew and self.runner is not None and self.runner.strategy.captured:
            self.runner.capture_graphs()

        def unsubscribe() -> None:
            stop()
            if self.feed is not None and not self.feed.subscribers:  # nobody reads the routing any more
                self.feed = self.model.routing_log = None
                self.runner.capture_graphs()
        return unsubscribe

    @property
    def tokens_prefilled(self) -> int:
        return self.runner.tokens_prefilled

    @property
    def tokens_decoded(self) -> int:
        return self.runner.tokens_decoded

    def _pool_blocks(self) -> int:
        c = self.config
        blocks = c.kv_blocks if c.kv_blocks is not None else (c.kv_bytes // self.block_bytes if c.kv_bytes else self.floor_blocks)
        self.check_floor(blocks)
        return blocks

    def check_floor(self, blocks: int) -> None:
        if blocks < self.floor_blocks:
            c = self.config
            raise WispError(
                f"KV pool too small: it has {blocks * self.block_bytes} bytes ({blocks} blocks) but "
                f"--max-concurrency {c.max_concurrency} x --max-model-len {self.max_model_len} needs "
                f"{self.floor_blocks * self.block_bytes} bytes ({self.floor_blocks} blocks of {self.block_bytes} bytes)"
            )

    # -- requests -----------------------------------------------------------------------------------
    def validate_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise WispError("prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise WispError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        limit = self.model_config.max_position_embeddings
        if len(prompt_ids) >= limit:
            raise WispError(f"prompt has {len(prompt_ids)} tokens; the model's limit is {limit} (max_position_embeddings)")
        if len(prompt_ids) >= self.max_model_len:
            raise WispError(f"prompt has {len(prompt_ids)} tokens; max-model-len is {self.max_model_len}")

    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, strict_length: bool = True,
        keep_logits: bool = False, constraint: TokenConstraint | None = None,
    ) -> None:
        """Queue a request. strict_length: prompt + max_tokens must fit max_model_len (else generation
        simply stops there). constraint: a grammar its tokens follow (`Grammars.constraint`), used by it alone."""
        self.validate_prompt(prompt_ids)
        vocab = self.model_config.vocab_size
        if any(token >= vocab for token, _ in params.logit_bias):
            raise InvalidParameter("logit_bias", f"logit_bias names a token id outside the vocabulary [0, {vocab})")
        if strict_length and len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise WispError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{len(prompt_ids) + params.max_tokens} exceeds max-model-len {self.max_model_len}"
            )
        if request_id in self.requests:
            raise WispError(f"request id {request_id!r} is already in use")
        decoder = self.tokenizer if params.skip_special_tokens or self.tokenizer is None \
            else self.tokenizer.keeping_special_tokens()
        detokenizer = IncrementalDetokenizer(decoder) if decoder is not None else None
        seq = Sequence(request_id, list(prompt_ids), params, self.max_model_len, keep_logits=keep_logits,
                       detokenizer=detokenizer, constraint=constraint)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        if self.live_split is not None:
            self.live_split.observe_request(seq.prompt_ids)

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is not None and not seq.finished:
            self.scheduler.finish(seq, "abort")
        if seq is not None and self.load_control is not None:
            self.load_control.forget(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the loop -----------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """One scheduled step; returns an output for each sequence that sampled a token or failed (a
        prefill chunk that does not reach its prompt's end samples nothing). Raises only if the batch's
        forward fails; a failure of one request's sampling or stop check finishes that request alone."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        start = time.perf_counter()
        sampled = self.runner.run(batch)
        if self.load_control is not None and batch.is_decode:
            self.load_control.after_step(len(batch.seqs), time.perf_counter() - start)
        done = self.scheduler.postprocess(batch, sampled, self.model_config.eos_token_ids)
        for seq in done:
            if seq.finished:
                self.requests.pop(seq.request_id, None)
                if self.load_control is not None:
                    self.load_control.forget(seq.request_id)
        if self.live_split is not None:
            self.live_split.after_step(sum(batch.num_tokens))
        return [_output(seq) for seq in done]

    def set_live_split(self, controller) -> None:
        """Let the online split controller (`wisp.engine.split_controller.controller.SplitController`) resize the pools while
        serving, starting from its current split (None: stop); see `wisp.engine.live_split`."""
        if self.live_split is not None:
            self.live_split.close()
        self.live_split = None if controller is None else LiveSplit(self, controller)

    # -- extras -------------------------------------------------------------------------------------
    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Logits [T, V] at every prompt position (teacher forcing), computed in fresh blocks."""
        self.validate_prompt(prompt_ids)
        need = -(-len(prompt_ids) // self.pool.block_size)
        if need > self.pool.available():
            raise WispError(f"the KV pool has no room for a {len(prompt_ids)}-token prompt right now")
        table = self.pool.allocate(need)
        try:
            return self.runner.prompt_logits(prompt_ids, table)
        finally:
            self.pool.release(table)

    def prompt_logprobs(self, prompt_ids: list[int], top: int) -> list[TokenLogprobs | None]:
        """Per prompt token, its log-probability given the tokens before it and the `top` most likely there (the
        first token: None), from a teacher-forced forward (`prompt_logits`)."""
        logits = self.prompt_logits(prompt_ids)  # [T, V]
        return [None] + [token_logprobs(row, token, top) for row, token in zip(logits[:-1], prompt_ids[1:])]

    def resize_kv(self, num_blocks: int) -> None:
        """Shrink or grow the KV pool between steps, requests running or not (see `apply_plan`)."""
        self.check_floor(num_blocks)
        self.runner.drop_graphs()  # they point at the old KV tensors
        self._resize_kv_tensors(num_blocks)
        self.runner.capture_graphs()

    def apply_plan(self, expert_caps: list[int], kv_blocks: int) -> ResizeTimings:
        """Resize both pools between steps, without draining: each paged layer's scratch to its cap (it
        refills on demand) and the KV pool to kv_blocks, keeping every used block and the most recently
        used cached ones (`BlockPool.resize_live`). The shrinking side goes first, so the two never hold
        their larger sizes at once; no request is preempted while kv_blocks holds the admission floor
        (every running request fits in it). Outputs stay bit-identical: KV blocks are copied bit for bit
        and a token's MoE result does not depend on which slots hold its experts (hybrid mode on a GPU
        excepted: what is resident decides what the CPU computes, which rounds differently). Returns how long each part
        took (the device synchronised between parts)."""
        self.check_floor(kv_blocks)
        paged = {li: s for li, s in self.model.experts.items() if s.slots is not None}
        if len(paged) != len(self.model.experts):
            raise WispError("a plan's expert caps resize expert slots: --mode paged or hybrid "
                            f"(this engine runs {self.config.mode}, with no slots)")
        cfg = EngineConfig(**{**self.config.__dict__, "per_layer_caps": tuple(expert_caps), "expert_cap": None})
        caps = dict(zip(self.model_config.moe_layer_ids, cfg.resolve_layer_caps(self.model_config)))
        clock = ResizeClock(self.device)
        self.runner.drop_graphs()  # they point at the old scratches and KV tensors
        kv_shrinks, kv_s = kv_blocks < self.pool.num_blocks, 0.0
        if kv_shrinks:
            self._resize_kv_tensors(kv_blocks)
            kv_s = clock.lap()
        for li, store in paged.items():
            store.resize_slots(caps[li])
        experts_s = clock.lap()
        if not kv_shrinks:
            self._resize_kv_tensors(kv_blocks)
            kv_s = clock.lap()
        self.config = self.runner.config = cfg
        self.expert_cap = max(caps.values())
        if self.load_control is not None:
            self.load_control.set_caps(caps)
        self.runner.capture_graphs()
        return ResizeTimings(kv_s, experts_s, clock.lap())

    @property
    def can_hold_hot(self) -> bool:
        """hybrid-zero-copy: every MoE store reads in place what the CPU does not compute (its VRAM: hot experts)."""
        stores = list(self.model.experts.values())
        return bool(stores) and all(s.rank_share for s in stores)

    def hold_hot_experts(self, hot: int, kv_blocks: int) -> None:
        """Hybrid with no slots: each MoE layer's device bank to `hot` experts (0: none; refilled from the next
        steps' routing) and the KV pool to kv_blocks, between steps, the shrinking side first (`apply_plan`'s
        rules; what `wisp.plan.hot_budget.hot_split` sizes from a VRAM budget)."""
        self.check_floor(kv_blocks)
        if not self.can_hold_hot:
            raise WispError(f"hot experts are --mode hybrid-zero-copy's; this engine runs {self.config.mode}")
        if not 0 <= hot <= self.model_config.num_experts:
            raise WispError(f"hot experts must be within 0..{self.model_config.num_experts}, got {hot}")
        self.runner.drop_graphs()  # they read the old banks and KV tensors
        kv_shrinks = kv_blocks < self.pool.num_blocks
        if kv_shrinks:
            self._resize_kv_tensors(kv_blocks)
        try:
            for store in self.model.experts.values():
                store.hold_hot(hot)
            if not kv_shrinks:
                self._resize_kv_tensors(kv_blocks)
        except torch.OutOfMemoryError:  # one consistent state to go on from: no hot experts anywhere
            for store in self.model.experts.values():
                store.hold_hot(0)
            hot = 0
            raise
        finally:
            self.config = self.runner.config = replace(self.config, hot_experts=hot)
            self.runner.capture_graphs()

    def _resize_kv_tensors(self, num_blocks: int) -> None:
        moves = self.pool.resize_live(num_blocks)
        self.kv.resize_keeping(num_blocks, moves, self.pool.num_used + self.pool.num_cached)
        for seq in self.scheduler.running:
            seq.block_table = [moves.get(b, b) for b in seq.block_table]

    def stats(self) -> dict:
        """Expert traffic (totals and per layer), step kinds, KV pool, scheduler and hybrid state
        (`wisp.engine.engine_stats`)."""
        return engine_stats(self)

    def reset_stats(self) -> None:
        sync_all_counters(self.model.experts.values())
        for s in self.model.experts.values():
            s.counters.reset()
        peak = self.pool.counters.peak_blocks_used
        self.pool.counters = type(self.pool.counters)()
        self.pool.counters.peak_blocks_used = min(peak, self.pool.num_used)
        self.runner.reset_counters()
        if self.load_control is not None:
            self.load_control.controller.reset_counters()


def _output(seq: Sequence) -> StepOutput:
    failure = seq.failure
    new_ids = [] if failure is not None else [seq.output_ids[-1]]  # a failed step gained no token
    return StepOutput(seq.request_id, new_ids, list(seq.output_ids), seq.text, seq.finished, seq.finish_reason,
                      len(seq.prompt_ids), None if failure is None else failure.message,
                      None if seq.output_logprobs is None else list(seq.output_logprobs))


def _weights(config: EngineConfig, cfg: ModelConfig, path: Path | None, device: torch.device):
    """Where the weights come from: made up on the device (--load-format dummy), or the checkpoint (a safetensors
    folder or a GGUF file)."""
    if config.load_format == "dummy":
        return RandomWeights(cfg, device=device)
    return GGUFCheckpoint(path, cfg) if is_gguf(path) else CheckpointReader(path)


def _tokenizer_config(path) -> tuple[str | None, dict]:
    file = path / "tokenizer_config.json"
    if not file.is_file():
        return None, {}
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise WispError(f"{file} is not valid JSON: {exc}") from None
    specials = {k: v for k, v in raw.items() if k in ("bos_token", "eos_token") and isinstance(v, str)}
    template = raw.get("chat_template")
    return (template if isinstance(template, str) else None), specials
