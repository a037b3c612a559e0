"""ModelRunner: a scheduled batch -> the model's forward over the KV pool -> one sampled token per sequence.

Owns the tensor side of a step: the step's input tensors (token ids, per-sequence chunks of the KV
pool), the eager forward, the decode strategy (`wisp.engine.decode`: chosen when the graphs are captured, it runs
decode batches), graph capture, sampling, and the step-kind counters (tokens prefilled / decoded, graph and piece
steps). It reads the sequences of a batch and never changes their progress: the scheduler's `postprocess` does
that with what `run` returns.

Extension points (benchmarks and tracing), in place of attributes patched onto the model:
- routing observers (`add_routing_observer`): see every eager step's routed experts per MoE layer and
  are told when a step begins. While any is registered, decode runs eagerly (an observer reads routing
  on the host, which a graph cannot), so the graphs need no re-capture.
- a routing replay (`set_routing_replay`): recorded expert choices in place of the router's. A graph
  reads the replay's buffer only if captured with it, so setting or clearing one re-captures the graphs.
- a routing log (`set_routing_log`, `wisp.engine.routing_log` or the load controller's
  `wisp.engine.routing_feed`): every step's routing written on the device, graphs included (set or
  cleared with a re-capture; the capture's warm-up rows are forgotten), told of each step's batch as it begins.

Sampling is per request: a sequence whose sampler raises gets a `RequestFailure` in place of its token
(`wisp.engine.request_failure`), and the others sample as usual; a failing forward raises from `run`.

Invariants: a step samples exactly the sequences whose tokens this step reach their end (a prefill
chunk short of its prompt's end only writes KV); a decode batch goes to the decode strategy only when it fits
the strategy's `max_batch` and no observer is registered, every other batch runs eagerly; capture writes only a
block it holds from the pool meanwhile (so it may run while requests hold KV), and `capture_graphs` re-captures
after the KV tensors or an expert scratch are reallocated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

import torch

from wisp.config import EngineConfig
from wisp.core.experts.store import sync_all_counters
from wisp.engine.block_pool import BlockPool
from wisp.engine.decode.graphs import GraphCapture, GraphInputs
from wisp.engine.decode.select import graph_strategy
from wisp.engine.decode.step_kinds import StepKindChooser
from wisp.engine.decode.strategy import DecodeStrategy, EagerDecode
from wisp.engine.kv_cache import BlockTableKV, DecodeBatchKV, KVCache
from wisp.engine.request_failure import RequestFailure
from wisp.engine.scheduler import Batch, decodes
from wisp.engine.sequence import Sequence
from wisp.engine.sequence_sampling import sample_sequences
from wisp.models.moe_decoder import Chunk, MoEDecoder


class RoutingObserver(Protocol):
    def begin_step(self) -> None:
        """A new engine step begins (its tokens were computed together)."""

    def record(self, layer: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """The routed experts [T, K] and their weights of a step's T tokens at one MoE layer."""


class RoutingReplayer(Protocol):
    def advance(self, batch: Batch) -> None:
        """A new engine step begins (`batch`: its sequences and their token counts): load its replayed choices."""

    def ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        """The expert ids [T, K] to use at `layer` in place of the router's `topk_ids`."""

    def replayed(self, layer: int, tokens: int) -> torch.Tensor:
        """The replayed ids [tokens, K] at `layer` (device, int64, unit column stride), -1 where the router's
        choice stands (`ids` is `replayed_or_routed` of these): the route kernel's `override`."""

    def prefetch(self, seqs: list[Sequence]) -> None:
        """While a step computes: queue the choices of the decode step that would follow (`advance` keeps them)."""


@dataclass(frozen=True)
class ObserverHandle:
    """What `add_routing_observer` returns: `remove()` unregisters the observer (again: no-op)."""

    remove: Callable[[], None]


class ModelRunner:
    def __init__(self, model: MoEDecoder, kv: KVCache, pool: BlockPool, config: EngineConfig, max_model_len: int):
        self.model, self.kv, self.pool = model, kv, pool
        self.config = config  # the engine replaces it when a plan is applied
        self.device = config.torch_device()
        self.max_model_len = max_model_len
        self.observers: list[RoutingObserver] = []
        self.replay: RoutingReplayer | None = None
        self.strategy: DecodeStrategy = EagerDecode()  # until graphs are captured
        self._capture_pending = False  # a capture that found no block to write its warm-up into
        self._capture_stream: torch.cuda.Stream | None = None  # one for every (re-)capture (`GraphCapture`)
        self.reset_counters()

    def reset_counters(self) -> None:
        self.tokens_prefilled = self.tokens_decoded = self.graph_steps = self.piece_steps = 0

    # -- extension points -------------------------------------------------------------------------------
    def add_routing_observer(self, observer: RoutingObserver) -> ObserverHandle:
        """Show `observer` the routing of every step from now on (decode then runs eagerly)."""
        self.observers.append(observer)
        self.model.routing_hook = self._record_routing
        return ObserverHandle(lambda: self._remove_observer(observer))

    def _remove_observer(self, observer: RoutingObserver) -> None:
        if observer in self.observers:
            self.observers.remove(observer)
        if not self.observers:
            self.model.routing_hook = None

    def _record_routing(self, layer: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        for observer in self.observers:
            observer.record(layer, topk_ids, topk_weights)

    def set_routing_replay(self, replay: RoutingReplayer | None) -> None:
        """Route by `replay` from now on (None: by the router again); re-captures the graphs."""
        self.replay = replay
        self.model.routing_override = replay
        self.capture_graphs()

    def set_routing_log(self, log) -> None:
        """Log every step's routing into `log` from now on (None: stop); re-captures the graphs."""
        self.model.routing_log = log
        self.capture_graphs()

    def _begin_step(self, batch: Batch) -> None:
        self.model.begin_step()
        if self.model.routing_log is not None:
            self.model.routing_log.begin_step(batch)
        if self.replay is not None:
            self.replay.advance(batch)
        for observer in self.observers:
            observer.begin_step()

    # -- CUDA graphs --------------------------------------------------------------------------------
    def graphs_enabled(self) -> bool:
        c = self.config
        # graphs read (paged, zero-copy) or copy (offload) host masters: only pinned memory may be captured
        # hybrid mode replays them where its CPU could not help a step, or where they measured faster (`run`)
        return (self.device.type == "cuda" and not c.enforce_eager and c.cuda_graph_max_batch > 0
                and not c.prefetch  # prefetch runs from the eager forward
                and (c.pin_memory or c.mode == "resident")
                and c.resolve_backend("moe", self.device) == "triton" and self.kv.uses_triton)

    def graph_max_batch(self) -> int:
        """The largest decode batch replayed as a CUDA graph. A paged store with staging rows runs a batch wider
        than its slots expert-major on the device, each missing expert copied once
        (`wisp.core.experts.expert_major_on_device`); one without them pages a graph in groups of C // top_k
        tokens, which would evict and reload experts group after group within one step, so there B x top_k
        <= its cap and a wider batch runs eagerly, expert-major (docs/decisions/wide-decode-batches-run-expert-major.md)."""
        c = self.config
        limit = min(c.cuda_graph_max_batch, c.max_concurrency)
        caps = [s.slots for s in self.model.experts.values() if s.slots is not None and not s.wide_in_graph]
        return min(limit, min(caps) // self.model.config.top_k) if caps else limit

    @property
    def step_kinds(self) -> StepKindChooser:
        """The measured choice between a CPU-helped and a whole-graph step (a fresh one where there is none)."""
        return self.strategy.chooser or StepKindChooser()

    def drop_graphs(self) -> None:
        """Forget the graphs (before the KV tensors or a scratch they point at are reallocated)."""
        self.strategy = EagerDecode()

    @torch.inference_mode()
    def capture_graphs(self) -> None:
        """(Re)capture the decode graphs, writing only one block taken from the pool meanwhile."""
        self.strategy = EagerDecode()  # new graphs (a new cap, a replay): a new strategy, measured afresh
        self._capture_pending = False
        if not self.graphs_enabled():
            return
        if self.pool.available() == 0:  # every block in use: decode eagerly until a step finds one free
            self._capture_pending = True
            return
        peak = self.pool.counters.peak_blocks_used
        scratch = self.pool.allocate(1)
        try:
            self._capture(scratch[0])
        finally:
            self.pool.release(scratch)
            self.pool.counters.peak_blocks_used = peak

    def _capture(self, scratch_block: int) -> None:
        stores = list(self.model.experts.values())
        sync_all_counters(stores)
        before = [replace(s.counters) for s in stores]
        hook, self.model.routing_hook = self.model.routing_hook, None  # observers see traffic, not the warm-up
        try:
            width = -(-self.max_model_len // self.pool.block_size)
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream(device=self.device)
            inputs = GraphInputs(self.device, self.graph_max_batch(), width, scratch_block)
            strategy, capture = graph_strategy(self.model, self.kv, inputs), GraphCapture(self._capture_stream)
            self.model.lru_state_on("device")
            with torch.cuda.device(self.device):  # Triton launches on the current device
                for b in range(inputs.max_batch, 0, -1):  # largest first: smaller graphs reuse its memory pool
                    strategy.capture(b, capture)
            self.strategy = strategy
        finally:
            self.model.routing_hook = hook
        sync_all_counters(stores)
        if self.model.routing_log is not None:
            self.model.routing_log.reset()  # nor is it logged
        for store, counters in zip(stores, before):  # the warm-up's routing is not traffic
            store.counters.copy_from(counters)
            store.forget_residents()  # its copies overwrote slots: the LRU restarts empty, as after a resize

    # -- a step ---------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, batch: Batch) -> list[int | RequestFailure | None]:
        """Compute the batch's tokens; per sequence the token it sampled, a RequestFailure where its
        sampling raised, or None where its tokens stop short of its end (a prefill chunk: KV written,
        nothing sampled)."""
        if self._capture_pending and self.pool.available():
            self.capture_graphs()
        self._begin_step(batch)
        if batch.is_decode and len(batch.seqs) <= self.strategy.max_batch and not self.observers:
            return self.strategy.run(batch, self)
        return self.eager_step(batch)

    # -- what a decode strategy asks of the runner (`wisp.engine.decode.strategy.DecodeRunner`) ----------------
    def eager_step(self, batch: Batch) -> list[int | RequestFailure | None]:
        if self.strategy.captured:
            self.model.lru_state_on("host")  # after graph decode: every layer's LRU state in one read
        sampling = [seq.num_computed + n == len(seq) for seq, n in zip(batch.seqs, batch.num_tokens)]
        logits = self._run_eager(batch, sampling)
        sampled = self.sample([s for s, keep in zip(batch.seqs, sampling) if keep], logits)
        tokens = iter(sampled)
        return [next(tokens) if keep else None for keep in sampling]

    @staticmethod
    def graph_inputs(seqs: list[Sequence]) -> tuple[list[int], list[int], list[list[int]]]:
        """A decode step's inputs as the graphs take them: each sequence's next token, its position, its blocks."""
        return [s.token_ids[s.num_computed] for s in seqs], [s.num_computed for s in seqs], [s.block_table for s in seqs]

    def count(self, kind: str, batch_size: int) -> None:
        """A decode step of `batch_size` sequences ran as "graph" (one replay) or "pieces"."""
        if kind == "graph":
            self.graph_steps += 1
        else:
            self.piece_steps += 1
        self.tokens_decoded += batch_size

    def _run_eager(self, batch: Batch, sampling: list[bool]) -> torch.Tensor | list:
        """The logits [S, V] at the last token of each sequence that samples (S of them). A decode batch on the
        Triton attention runs its attention as one launch a layer over the whole batch (`DecodeBatchKV`, as the
        graphs do: the same arithmetic as a chunk's launch, so the same bits), not one launch per sequence."""
        if batch.is_decode and self.kv.uses_triton:
            return self._decode_eager(batch)
        chunks, tokens = [], []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            chunks.append(Chunk(BlockTableKV(self.kv, seq.block_table), seq.num_computed, n))
            tokens.extend(seq.token_ids[seq.num_computed : seq.num_computed + n])
            self._count(seq, n)
        hidden = self.model.forward(torch.tensor(tokens, device=self.device), chunks)
        ends = torch.tensor([c.length for c in chunks]).cumsum(0) - 1
        rows = [i for i, keep in enumerate(sampling) if keep]
        return self.model.logits(hidden[ends[rows].to(self.device)]) if rows else []

    def _decode_eager(self, batch: Batch) -> torch.Tensor:
        """The logits [B, V] of a decode batch (every sequence samples), attention batched on the device."""
        tokens, positions, tables = self.graph_inputs(batch.seqs)
        width = max(map(len, tables))
        dev = self.device
        positions = torch.tensor(positions, device=dev)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=dev)  # [B, W]
        for seq in batch.seqs:
            self._count(seq, 1)
        hidden = self.model.forward_batch(torch.tensor(tokens, device=dev), positions,
                                          DecodeBatchKV(self.kv, tables, positions))
        return self.model.logits(hidden)

    def _count(self, seq: Sequence, n: int) -> None:
        if decodes(seq, n):
            self.tokens_decoded += 1
        else:
            self.tokens_prefilled += n

    def sample(self, seqs: list[Sequence], logits) -> list[int | RequestFailure]:
        """Each sequence's next token from its logits row (`logits` [S, V]), or its RequestFailure if its sampling
        raised (`wisp.engine.sequence_sampling`)."""
        if self.replay is not None:  # the next step's replayed routing, queued while the device computes this one's
            self.replay.prefetch(seqs)
        return sample_sequences(seqs, logits)

    @torch.inference_mode()
    def prompt_logits(self, prompt_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """Logits [T, V] at every prompt position (teacher forcing), the prompt's KV written in block_table."""
        kv = BlockTableKV(self.kv, block_table)
        if self.model.routing_log is not None:
            self.model.routing_log.begin_step(None)
        hidden = self.model.forward(torch.tensor(prompt_ids, device=self.device), [Chunk(kv, 0, len(prompt_ids))])
        return self.model.logits(hidden)
