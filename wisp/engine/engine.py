"""LLMEngine: one loop of schedule() -> model forward over the KV pool -> postprocess().

Owns the model, the KV cache tensors, the block pool and the scheduler, sized and validated at start:
the engine refuses to start unless the pool holds the admission floor, max_concurrency (W) x
ceil(max_model_len (L) / block_size) blocks, and says in one line how many bytes it has and needs.

Not thread-safe: one thread calls add_request / abort_request / step (the server runs it in its own).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from wisp.config import EngineConfig, ModelConfig, parse_dtype
from wisp.core.counters import sum_counters
from wisp.core.experts import PagedExperts, sync_all_counters
from wisp.engine.block_pool import BlockPool
from wisp.engine.cuda_graphs import DecodeGraphs
from wisp.engine.kv_cache import BlockTableKV, KVCache
from wisp.engine.sampling import SamplingParams
from wisp.engine.scheduler import Scheduler, decodes
from wisp.engine.sequence import Sequence
from wisp.engine.tokenizer import TextTokenizer
from wisp.errors import WispError
from wisp.models.loader import CheckpointReader, load_model
from wisp.models.presets import PRESETS, preset
from wisp.models.random_checkpoint import RandomWeights
from wisp.models.moe_decoder import Chunk
from wisp.models.source import resolve_model_path


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    token_ids: list[int]  # all generated so far
    text: str  # all text so far, cut at a matched stop string
    finished: bool
    finish_reason: str | None
    prompt_tokens: int


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
        bs = config.kv_block_size
        self.block_bytes = KVCache.block_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, bs, cfg.dtype)
        self.floor_blocks = config.max_concurrency * -(-self.max_model_len // bs)
        num_blocks = self._pool_blocks()
        self.tokenizer = TextTokenizer.from_dir(self.path) if self.path else None
        self.chat_template, self.special_tokens = _tokenizer_config(self.path) if self.path else (None, {})
        if config.load_format == "dummy":
            reader = RandomWeights(cfg, device=self.device)
        else:
            reader = CheckpointReader(self.path)
        self.model = load_model(reader, cfg, config, self.device)
        self.kv = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, bs, num_blocks, cfg.dtype, self.device,
                          attention=config.resolve_backend("attention", self.device))
        self.pool = BlockPool(num_blocks, bs)
        self.scheduler = Scheduler(self.pool, config.max_concurrency, config.max_num_batched_tokens,
                                   config.enable_prefix_caching)
        self.requests: dict[str, Sequence] = {}
        self.step_hooks: list = []  # called before each forward (e.g. a routing recorder opening a step)
        self.tokens_prefilled = 0
        self.tokens_decoded = 0
        self.graphs: DecodeGraphs | None = None
        self.graph_steps = 0
        self.capture_graphs()

    def graphs_enabled(self) -> bool:
        c = self.config
        # graphs read (paged, zero-copy) or copy (offload) host masters: only pinned memory may be captured
        return (self.device.type == "cuda" and not c.enforce_eager and c.cuda_graph_max_batch > 0
                and (c.pin_memory or c.mode == "resident")
                and c.resolve_backend("moe", self.device) == "triton" and self.kv.uses_triton)

    def graph_max_batch(self) -> int:
        """The largest decode batch replayed as a CUDA graph. In paged mode also B x top_k <= the smallest
        cap: a graph pages in device groups of C // top_k tokens, and a wider batch would evict and reload
        experts group after group within one step; it runs eagerly instead, expert-major, each missing
        expert copied once (replayed real Mixtral decode routing, four streams at once, C = 4: 3.34 -> 2.55
        misses per layer and step; `benchmarks/wide_step_rules.py`)."""
        c = self.config
        limit = min(c.cuda_graph_max_batch, c.max_concurrency)
        caps = [s.pager.capacity for s in self.model.experts.values() if isinstance(s, PagedExperts)]
        return min(limit, min(caps) // self.model_config.top_k) if caps else limit

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """(Re)capture the decode graphs; only while the pool holds no data (the warm-up writes block 0)."""
        self.graphs = None
        if not self.graphs_enabled():
            return
        assert self.pool.num_used == 0 and self.pool.num_cached == 0, "decode graphs are captured only over an empty pool"
        width = -(-self.max_model_len // self.pool.block_size)
        stores = list(self.model.experts.values())
        sync_all_counters(stores)
        before = [replace(s.counters) for s in stores]
        self.graphs = DecodeGraphs(self.model, self.kv, self.graph_max_batch(), width)
        sync_all_counters(stores)
        for store, counters in zip(stores, before):  # the warm-up's routing is not traffic
            store.counters.copy_from(counters)
            if isinstance(store, PagedExperts):
                store.pager.clear()  # its copies overwrote slots: the LRU restarts empty, as after a resize

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
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, strict_length: bool = True, keep_logits: bool = False
    ) -> None:
        """Queue a request. strict_length: prompt + max_tokens must fit max_model_len (else generation
        simply stops there)."""
        self.validate_prompt(prompt_ids)
        if strict_length and len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise WispError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{len(prompt_ids) + params.max_tokens} exceeds max-model-len {self.max_model_len}"
            )
        if request_id in self.requests:
            raise WispError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, list(prompt_ids), params, self.max_model_len, keep_logits=keep_logits)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is not None and not seq.finished:
            self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the loop -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """One scheduled step; returns an output for each sequence that sampled a token (a prefill chunk
        that does not reach its prompt's end samples nothing)."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        for hook in self.step_hooks:
            hook()
        seqs = batch.seqs
        if batch.is_decode and self.graphs is not None and len(seqs) <= self.graphs.max_batch \
                and self.model.routing_hook is None:
            logits = self.graphs.run([s.token_ids[s.num_computed] for s in seqs], [s.num_computed for s in seqs],
                                     [s.block_table for s in seqs])
            self.graph_steps += 1
            self.tokens_decoded += len(seqs)
            return [self._postprocess(seq, 1, row) for seq, row in zip(seqs, logits)]
        if self.graphs is not None:
            self.model.use_paging_side("host")  # after graph decode: every layer's LRU state in one read
        chunks, tokens = [], []
        for seq, n in zip(seqs, batch.num_tokens):
            ids = seq.token_ids[seq.num_computed : seq.num_computed + n]
            chunks.append(Chunk(BlockTableKV(self.kv, seq.block_table), seq.num_computed, n))
            tokens.extend(ids)
            if decodes(seq, n):
                self.tokens_decoded += 1
            else:
                self.tokens_prefilled += n
        hidden = self.model.forward(torch.tensor(tokens, device=self.device), chunks)
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        sampling = [i for i, (seq, n) in enumerate(zip(seqs, batch.num_tokens)) if seq.num_computed + n == len(seq)]
        logits = self.model.logits(hidden[ends[sampling].to(self.device)]) if sampling else []
        for i, (seq, n) in enumerate(zip(seqs, batch.num_tokens)):
            if i not in sampling:  # a prefill chunk short of the prompt's end: KV written, nothing sampled
                seq.num_computed += n
                self._register_full_blocks(seq)
        return [self._postprocess(seqs[i], batch.num_tokens[i], row) for i, row in zip(sampling, logits)]

    def _postprocess(self, seq: Sequence, computed: int, logits: torch.Tensor) -> StepOutput:
        seq.num_computed += computed
        self._register_full_blocks(seq)
        token = seq.sampler(logits)
        now = time.perf_counter()
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.output_ids.append(token)
        if seq.logits is not None:
            seq.logits.append(logits.cpu())
        p = seq.params
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.model_config.eos_token_ids):
            reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or len(seq) >= seq.max_len:
            reason = "length"
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(seq.output_ids)
            for stop in p.stop:
                cut = seq.text.find(stop)
                if cut >= 0:
                    seq.text, reason = seq.text[:cut], "stop"
        if reason is not None:
            seq.finish_time = now
            self.scheduler.finish(seq, reason)
            self.requests.pop(seq.request_id, None)
        return StepOutput(seq.request_id, [token], list(seq.output_ids), seq.text, seq.finished, seq.finish_reason, len(seq.prompt_ids))

    def _register_full_blocks(self, seq: Sequence) -> None:
        bs, ids = self.pool.block_size, seq.token_ids
        for i in range(len(seq.block_keys), seq.num_computed // bs):
            parent = seq.block_keys[-1] if seq.block_keys else None
            seq.block_keys.append(self.pool.register(seq.block_table[i], parent, ids[i * bs : (i + 1) * bs]))

    # -- extras -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Logits [T, V] at every prompt position (teacher forcing), computed in fresh blocks."""
        self.validate_prompt(prompt_ids)
        need = -(-len(prompt_ids) // self.pool.block_size)
        if need > self.pool.available():
            raise WispError(f"the KV pool has no room for a {len(prompt_ids)}-token prompt right now")
        table = self.pool.allocate(need)
        try:
            kv = BlockTableKV(self.kv, table)
            hidden = self.model.forward(torch.tensor(prompt_ids, device=self.device), [Chunk(kv, 0, len(prompt_ids))])
            return self.model.logits(hidden)
        finally:
            self.pool.release(table)

    def resize_kv(self, num_blocks: int, capture: bool = True) -> None:
        """Shrink or grow the KV pool; only when no request is running (the prefix cache is dropped)."""
        if self.scheduler.running:
            raise WispError(f"cannot resize the KV pool while {len(self.scheduler.running)} requests run")
        self.check_floor(num_blocks)
        self.graphs = None  # they point at the old KV tensors
        self.pool.resize(num_blocks)
        self.kv.resize(num_blocks)
        if capture:
            self.capture_graphs()

    def apply_plan(self, expert_caps: list[int], kv_blocks: int) -> None:
        """Resize both pools at a drained moment: each paged layer's scratch to its cap, the KV pool to
        kv_blocks. The shrinking side is freed before the other grows; outputs stay bit-identical."""
        if self.scheduler.running:
            raise WispError(f"cannot apply a plan while {len(self.scheduler.running)} requests run")
        self.check_floor(kv_blocks)
        cfg = EngineConfig(**{**self.config.__dict__, "per_layer_caps": tuple(expert_caps), "expert_cap": None})
        caps = dict(zip(self.model_config.moe_layer_ids, cfg.resolve_layer_caps(self.model_config)))
        paged = {li: s for li, s in self.model.experts.items() if isinstance(s, PagedExperts)}
        if len(paged) != len(caps):
            raise WispError("a plan's expert caps apply to --mode paged only")
        kv_shrinks = kv_blocks < self.pool.num_blocks
        self.graphs = None  # they point at the old scratches
        if kv_shrinks:
            self.resize_kv(kv_blocks, capture=False)
        for li, store in paged.items():
            store.resize(caps[li])
        if not kv_shrinks:
            self.resize_kv(kv_blocks, capture=False)
        self.config = cfg
        self.expert_cap = max(caps.values())
        self.capture_graphs()

    def stats(self) -> dict:
        stores = self.model.experts
        sync_all_counters(stores.values())  # one host read for every layer's device counts
        total = sum_counters(s.counters for s in stores.values())
        routed = total.hits + total.misses
        pool, kvc = self.pool, self.pool.counters
        return {
            "mode": self.config.mode,
            "expert_cap": self.expert_cap,
            "expert_caps": {str(li): s.pager.capacity for li, s in stores.items() if isinstance(s, PagedExperts)},
            "expert_hits": total.hits,
            "expert_misses": total.misses,
            "expert_evictions": total.evictions,
            "expert_loads": total.loads,
            "bytes_h2d": total.bytes_h2d,
            "moe_steps": total.steps,
            "hit_rate": total.hits / routed if routed else 0.0,
            "tokens_prefilled": self.tokens_prefilled,
            "tokens_decoded": self.tokens_decoded,
            "graph_steps": self.graph_steps,
            "expert_device_bytes": sum(s.device_bytes for s in stores.values()),
            "expert_staging_bytes": _staging_bytes(stores.values()),  # wide steps' two buffers, shared by layers
            "kv_block_size": pool.block_size,
            "kv_block_bytes": self.block_bytes,
            "kv_blocks_total": pool.num_blocks,
            "kv_blocks_used": pool.num_used,
            "kv_blocks_cached": pool.num_cached,
            "kv_blocks_free": pool.num_free,
            "kv_peak_blocks_used": kvc.peak_blocks_used,
            "prefix_hit_tokens": kvc.prefix_hit_tokens,
            "prefix_miss_tokens": kvc.prefix_miss_tokens,
            "preemptions": kvc.preemptions,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "per_layer": {str(li): s.counters.as_dict() for li, s in stores.items()},
        }

    def reset_stats(self) -> None:
        sync_all_counters(self.model.experts.values())
        for s in self.model.experts.values():
            s.counters.reset()
        peak = self.pool.counters.peak_blocks_used
        self.pool.counters = type(self.pool.counters)()
        self.pool.counters.peak_blocks_used = min(peak, self.pool.num_used)
        self.tokens_prefilled = self.tokens_decoded = self.graph_steps = 0


def _staging_bytes(stores) -> int:
    staging = {id(s.staging): s.staging for s in stores if isinstance(s, PagedExperts) and s.staging is not None}
    return sum(b.device_bytes for b in staging.values())


def model_source(config: EngineConfig) -> tuple[Path | None, ModelConfig]:
    """(checkpoint folder or None, config): a folder / 'demo' / hub id, or with --load-format dummy also
    a preset name (qwen3-30b-a3b, ...), whose weights are made up on the device."""
    if config.model in PRESETS:
        if config.load_format != "dummy":
            raise WispError(f"{config.model} is a shape preset with no weights: use --load-format dummy")
        return None, ModelConfig.from_hf(preset(config.model))
    path = resolve_model_path(config.model)
    return path, ModelConfig.from_dir(path)


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
