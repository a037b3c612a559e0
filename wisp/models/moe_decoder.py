"""One generic MoE decoder for the supported families (our code; transformers is the test oracle).

Forward contract: `forward(tokens [T], chunks)` where `chunks` lists, in token order, the sequences the
T tokens belong to: (kv, start, length). A chunk's tokens sit at positions start..start+length-1 of its
sequence; their keys/values are written into `kv` and attend causally to everything before them. A
prefill is one chunk of many tokens; a batched decode step is one chunk of one token per sequence.

Batch invariance: every per-row op is row-invariant (`wisp.core.kernels.rows`), attention runs per chunk, and
the MoE stores are slot- and batch-invariant, so a sequence's logits do not depend on what else is in
the batch or on the expert mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol, Sequence

import torch
import torch.nn.functional as F

from wisp.config import ModelConfig
from wisp.core.kernels import rows
from wisp.core.kernels.fp8_blocks import DEFAULT_BLOCK, Fp8BlockWeight
from wisp.core.kernels.quantized_weights import BlockWeight
from wisp.core.experts.store import ExpertStore, lru_state_on
from wisp.models.families import get_family
from wisp.models.mla import MlaWeights, mla_attention
from wisp.models.rope import inv_freq
from wisp.models.token_embedding import TokenEmbedding


class KVStorage(Protocol):
    """One sequence's KV: `write` stores a layer's new keys/values at positions start.., `attend` runs
    causal attention of queries at positions start.. over everything stored up to them."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> None: ...

    def attend(self, layer: int, q: torch.Tensor, start: int, window: int | None,
               sinks: torch.Tensor | None = None) -> torch.Tensor: ...


@dataclass
class Chunk:
    kv: KVStorage
    start: int
    length: int


@dataclass
class AttentionWeights:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None  # [H] GPT-OSS's per-head sink logits
    qkv: torch.Tensor | Fp8BlockWeight | BlockWeight | None = None  # [q; k; v] rows in one weight (`fuse_qkv`), q, k, v its views
    qkv_bias: torch.Tensor | None = None

    def fuse_qkv(self) -> None:
        """Put q, k and v in one weight (one launch projects all three), each left as a view of its rows: the
        same bytes, no copy kept. An FP8 weight's scale rows follow its rows (each part's rows fill whole
        128-row blocks, or nothing is fused); a GGUF block weight's too (all three in one format, or nothing is
        fused)."""
        parts, biases = (self.q, self.k, self.v), (self.q_bias, self.k_bias, self.v_bias)
        if len({b is None for b in biases}) > 1:
            return  # some biased, some not: left apart
        if isinstance(self.q, Fp8BlockWeight):
            if any(p.shape[0] % DEFAULT_BLOCK[0] for p in parts):
                return
            self.qkv = Fp8BlockWeight(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]))
            rows = [p.shape[0] for p in parts]
            self.q, self.k, self.v = map(Fp8BlockWeight, self.qkv.weight.split(rows),
                                         self.qkv.scale.split([r // DEFAULT_BLOCK[0] for r in rows]))
        elif isinstance(self.q, BlockWeight) or isinstance(self.v, BlockWeight):  # a GGUF file's: one format for all
            if not all(isinstance(p, BlockWeight) for p in parts) or len({p.format for p in parts}) > 1:
                return  # (Q4_K_M keeps v in Q6_K beside q and k in Q4_K: three launches)
            self.qkv = BlockWeight(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]))
            rows = [p.shape[0] for p in parts]
            self.q, self.k, self.v = map(BlockWeight, self.qkv.weight.split(rows), self.qkv.scale.split(rows))
        else:
            self.qkv = torch.cat(parts)
            self.q, self.k, self.v = self.qkv.split([p.shape[0] for p in parts])
        if biases[0] is not None:
            self.qkv_bias = torch.cat(biases)
            self.q_bias, self.k_bias, self.v_bias = self.qkv_bias.split([b.shape[0] for b in biases])


class ChunkedKV:
    """The KV of a forward given as chunks (see the module docstring): attention runs chunk by chunk."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = chunks

    def cache_slots(self, layer: int) -> None:
        """None: each chunk's storage writes its own keys and values (`write_attend`)."""
        return None

    def write_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty_like(q)
        offset = 0
        for c in self.chunks:
            sl = slice(offset, offset + c.length)
            c.kv.write(layer, k[sl], v[sl], c.start)
            out[sl] = c.kv.attend(layer, q[sl], c.start, window, sinks)
            offset += c.length
        return out


@dataclass
class MLPWeights:
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    attn: AttentionWeights | MlaWeights
    router: torch.Tensor | None = None  # [N, D] for MoE layers
    router_bias: torch.Tensor | None = None  # [N] (GPT-OSS)
    dense: MLPWeights | None = None  # non-MoE layers
    shared: MLPWeights | None = None  # Qwen2-MoE shared expert
    shared_gate: torch.Tensor | None = None  # [1, D] (Qwen2-MoE; DeepSeek's shared experts are ungated)


def mlp(x: torch.Tensor, w: MLPWeights, linear) -> torch.Tensor:
    """The dense gated MLP of x through `linear` (the decoder's projection: `rows.linear` or the Triton one)."""
    return linear(rows.silu_mul(linear(x, w.gate), linear(x, w.up)), w.down)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


@dataclass
class Piece:
    """Where a piece of a forward stopped (`MoEDecoder.forward_piece`): the residual stream x [T, D] (final
    and normed when layer is None), the rotation, and at MoE layer `layer` its experts' input [T, D] and
    routing [T, K]."""

    x: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]
    layer: int | None = None
    hidden: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None


class MoEDecoder:
    def __init__(
        self,
        config: ModelConfig,
        embed: TokenEmbedding,
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        layers: list[LayerWeights],
        experts: dict[int, ExpertStore],
        backend: str = "torch",
    ):
        self.config = config
        self.router_dtype = get_family(config.family).router_dtype  # None: the activations' dtype
        self.embed = embed
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.layers = layers
        self.experts = experts  # layer index -> store, MoE layers only
        self.steps_begun = 0  # begin_step calls so far
        self.routing_hook = None  # called as hook(layer, topk_ids, topk_weights) when set (trace recording)
        self.routing_override = None  # .ids(layer, topk_ids) -> replayed ids (benchmarks only)
        self.routing_log = None  # .record(layer, topk_ids): device-side, graph-safe (wisp.engine.routing_log)
        self.device = final_norm.device
        self.dtype = embed.dtype
        self.rms_norm = rows.rms_norm  # "triton": one row-invariant kernel per norm / rotation (CUDA)
        if config.norm_weight_float32:
            self.rms_norm = rows.rms_norm_float32_weight
        self.add_rms_norm = self._add_then_norm  # "triton": the residual add and the next norm in one launch
        self.apply_rope = apply_rope
        self.linear = rows.linear  # the dense projections; "triton" on CUDA: one row-invariant launch each
        self.route_kernel = None  # "triton": softmax + top-k + renormalise in one launch
        self.qkv_heads = None  # "triton": q/k norms, rotation and v's copy of one q/k/v projection in one launch
        if backend == "triton":
            from wisp.core.kernels.triton_norm import triton_add_rms_norm, triton_rms_norm
            from wisp.core.kernels.triton_rope import triton_rope
            from wisp.core.kernels.triton_router import triton_route

            f32 = config.norm_weight_float32
            self.rms_norm = partial(triton_rms_norm, weight_in_float32=f32)
            self.add_rms_norm = partial(triton_add_rms_norm, weight_in_float32=f32)
            if config.routing in ("softmax_topk", "topk_softmax"):  # GPT-OSS: the top-k first, then the softmax
                self.route_kernel = partial(triton_route, topk_first=config.routing == "topk_softmax")
            if config.rope_dim & (config.rope_dim - 1) == 0:  # the Triton rotation needs a power of two
                self.apply_rope = triton_rope
            if self.device.type == "cuda":  # (the interpreter's CPU runs keep the 16-row tiles: far faster there)
                from wisp.core.kernels.triton_linear import triton_linear

                self.linear = triton_linear
                for lw in layers:  # one launch projects q, k and v
                    if isinstance(lw.attn, AttentionWeights):
                        lw.attn.fuse_qkv()
            if self.qkv_heads_fit():
                from wisp.core.kernels.triton_qkv_heads import triton_qkv_heads

                self.qkv_heads = triton_qkv_heads
        self.inv_freq = inv_freq(config.rope, config.rope_dim).to(self.device)

    def qkv_heads_fit(self) -> bool:
        """Whether q/k/v's heads can be made ready in one launch (`triton_qkv_heads`): the Triton kernels, a
        rotation over the whole power-of-two head, norm weights in the activations' dtype, no clipping."""
        cfg = self.config
        return (self.apply_rope is not apply_rope and cfg.mla is None and cfg.rope_dim == cfg.head_dim
                and cfg.clip_qkv is None and not cfg.norm_weight_float32 and cfg.qk_norm in ("none", "per_head", "full"))

    def _add_then_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm): the residual add then `rms_norm`, each its own op (the torch path)."""
        total = x + delta
        return total, self.rms_norm(total, weight, eps)

    # -- pieces -------------------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        cos, sin = rows.pointwise(torch.cos, emb), rows.pointwise(torch.sin, emb)  # row-invariant on the CPU
        if (factor := self.config.rope.attention_factor) != 1.0:  # yarn
            cos, sin = cos * factor, sin * factor
        return cos.to(self.dtype)[:, None, :], sin.to(self.dtype)[:, None, :]

    def attention(self, li: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv) -> torch.Tensor:
        cfg, w = self.config, self.layers[li].attn
        if cfg.mla is not None:
            return mla_attention(self, li, x, rope, kv)
        t, h, hd = x.shape[0], cfg.num_heads, cfg.head_dim
        if w.qkv is not None and self.qkv_heads is not None:
            slots = kv.cache_slots(li)  # where the kv takes the keys and values straight from this launch, if it does
            q, k, v = self.qkv_heads(self.linear(x, w.qkv, w.qkv_bias), h, cfg.num_kv_heads, *rope, norm=cfg.qk_norm,
                                     q_norm=w.q_norm, k_norm=w.k_norm, eps=cfg.rms_norm_eps, cache=slots)  # [T, H(kv), hd]
        else:
            slots, (q, k, v) = None, self.heads_apart(w, x, rope)
        window = cfg.window_of(li)
        out = kv.write_attend(li, q, k, v, window, w.sinks) if slots is None else kv.attend(li, q, window, w.sinks)
        return self.linear(out.reshape(t, h * hd), w.o, w.o_bias)  # out [T, H, hd]

    def heads_apart(self, w: AttentionWeights, x: torch.Tensor, rope) -> tuple[torch.Tensor, ...]:
        """q [T, H, hd], k and v [T, Hkv, hd] of x, each step its own launch: the projections (one if fused),
        the q/k norms, clipping and the rotation (where `qkv_heads` cannot do them in one)."""
        cfg = self.config
        t, h, hkv, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        if w.qkv is not None:
            q, k, v = self.linear(x, w.qkv, w.qkv_bias).split([h * hd, hkv * hd, hkv * hd], dim=1)
        else:
            q, k, v = (self.linear(x, wt, b) for wt, b in ((w.q, w.q_bias), (w.k, w.k_bias), (w.v, w.v_bias)))
        if cfg.qk_norm == "full":
            q, k = self.rms_norm(q, w.q_norm, cfg.rms_norm_eps), self.rms_norm(k, w.k_norm, cfg.rms_norm_eps)
        q, k, v = q.view(t, h, hd), k.view(t, hkv, hd), v.view(t, hkv, hd)
        if cfg.qk_norm == "per_head":
            q, k = self.rms_norm(q, w.q_norm, cfg.rms_norm_eps), self.rms_norm(k, w.k_norm, cfg.rms_norm_eps)
        if cfg.clip_qkv is not None:
            q, k, v = (z.clamp(-cfg.clip_qkv, cfg.clip_qkv) for z in (q, k, v))
        return self.apply_rope(q, *rope), self.apply_rope(k, *rope), v

    def route(self, li: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A MoE layer's routing of x [T, D]: expert ids and their weights, [T, K] each."""
        cfg, lw = self.config, self.layers[li]
        logits = self.linear(x.float() if cfg.router_float32 else x, lw.router, lw.router_bias)  # [T, N]
        weight_dtype = self.router_dtype or x.dtype
        if self.route_kernel is not None:  # a replay's ids taken in the same launch
            override = None if self.routing_override is None else self.routing_override.replayed(li, logits.shape[0])
            topk_weights, topk_ids = self.route_kernel(logits, cfg.top_k, cfg.norm_topk_prob, weight_dtype,
                                                       override)  # [T, K]
        elif cfg.routing == "topk_softmax":  # GPT-OSS: top-k of the logits, softmax over those k
            top, topk_ids = torch.topk(logits, cfg.top_k, dim=-1)  # [T, K]
            if self.routing_override is not None:
                topk_ids = self.routing_override.ids(li, topk_ids)
                top = logits.gather(1, topk_ids)
            topk_weights = F.softmax(top.float(), dim=-1).to(weight_dtype)
        else:
            probs = F.softmax(logits, dim=-1, dtype=torch.float32)
            topk_ids = torch.topk(probs, cfg.top_k, dim=-1).indices  # [T, K]
            if self.routing_override is not None:  # benchmark replay of recorded routing
                topk_ids = self.routing_override.ids(li, topk_ids)
            topk_weights = probs.gather(1, topk_ids)  # the top-k values themselves when not replaced
            if cfg.norm_topk_prob:
                topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
            topk_weights = topk_weights.to(weight_dtype)
        if cfg.routed_scaling != 1.0:
            topk_weights = topk_weights * cfg.routed_scaling
        if self.routing_hook is not None:
            self.routing_hook(li, topk_ids, topk_weights)
        if self.routing_log is not None:
            self.routing_log.record(li, topk_ids)
        return topk_ids, topk_weights

    def routed_experts(self, piece: "Piece", graph_safe: bool = False) -> torch.Tensor:
        """The routed experts' output [T, D] at the MoE layer `piece` stopped at (its store's forward)."""
        store = self.experts[piece.layer]
        forward = store.forward_graph_safe if graph_safe else store.forward
        return forward(piece.hidden, piece.topk_ids, piece.topk_weights)

    def with_shared(self, li: int, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """A MoE layer's output: the routed experts' `routed` [T, D] plus its shared expert of x, if any."""
        lw = self.layers[li]
        if lw.shared is None:
            return routed
        shared = mlp(x, lw.shared, self.linear)
        if lw.shared_gate is not None:  # Qwen2-MoE's sigmoid gate; DeepSeek's shared experts are ungated
            shared = rows.pointwise(torch.sigmoid, self.linear(x, lw.shared_gate)) * shared  # [T, 1] * [T, D]
        return routed + shared

    # -- whole model --------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, chunks: Sequence[Chunk]) -> torch.Tensor:
        """tokens [T] -> final hidden states [T, D] (after the last norm)."""
        positions = torch.cat([torch.arange(c.start, c.start + c.length) for c in chunks]).to(self.device)
        return self.forward_batch(tokens, positions, ChunkedKV(chunks))

    def forward_batch(self, tokens: torch.Tensor, positions: torch.Tensor, kv, graph_safe: bool = False) -> torch.Tensor:
        """tokens [T] at positions [T], attention through `kv.write_attend` (or, where `kv.cache_slots(layer)` names
        the cache's slots, the fused heads' launch writes them and `kv.attend` reads) -> final hidden [T, D]: the pieces
        between MoE layers' experts, each layer's experts run between them.
        graph_safe: MoE stores run `forward_graph_safe` (no host sync: the body of a CUDA-graph decode step)."""
        if graph_safe and self.routing_hook is not None:
            raise RuntimeError("a routing hook reads routing on the host: it cannot run in a graph-safe (CUDA-graph) step")
        piece = self.forward_piece(tokens, positions, kv)
        while piece.layer is not None:
            piece = self.forward_piece(tokens, positions, kv, piece, self.routed_experts(piece, graph_safe))
        return piece.x

    def forward_piece(self, tokens: torch.Tensor, positions: torch.Tensor, kv, before: "Piece | None" = None,
                      routed: torch.Tensor | None = None) -> "Piece":
        """One piece of a forward: from the embedding (before=None), or on from `before`'s MoE layer whose
        routed experts output `routed` [T, D]; runs layers until the next MoE layer is routed (a Piece at
        that layer) or through the last layer and the final norm (a Piece with layer None and x final).
        A piece is graph-safe unless a routing hook is set (it reads routing on the host): only the routed
        experts between pieces may sync (the piece strategies, `wisp.engine.decode`)."""
        eps = self.config.rms_norm_eps
        if before is None:  # the rotation: once per forward
            x, rope, start = self.embed(tokens), self.rope(positions), 0
            h = self.rms_norm(x, self.input_norm(0), eps)
        else:
            x, rope, start = before.x, before.rope, before.layer + 1
            x, h = self.add_rms_norm(x, self.with_shared(before.layer, before.hidden, routed), self.input_norm(start),
                                     eps)
        for li in range(start, len(self.layers)):  # h: x normed for layer li's attention
            lw = self.layers[li]
            x, h = self.add_rms_norm(x, self.attention(li, h, rope, kv), lw.post_norm, eps)
            if lw.router is None:
                x, h = self.add_rms_norm(x, mlp(h, lw.dense, self.linear), self.input_norm(li + 1), eps)
                continue
            return Piece(x, rope, li, h, *self.route(li, h))
        return Piece(h, rope)

    def input_norm(self, li: int) -> torch.Tensor:
        """The norm weight before layer li's attention; past the last layer, the final norm's."""
        return self.layers[li].input_norm if li < len(self.layers) else self.final_norm

    def begin_step(self) -> None:
        """Once per step, before it runs: every store hears the step's number (state shared by layers,
        such as hybrid's pace, acts once per number)."""
        self.steps_begun += 1
        for store in self.experts.values():
            store.begin_step(self.steps_begun)

    def graph_step_ok(self, batch_size: int) -> bool:
        """Whether a decode step of `batch_size` sequences may replay a CUDA graph (every store agrees)."""
        max_misses = min(batch_size * self.config.top_k, self.config.num_experts)
        return all(store.graph_step_ok(max_misses) for store in self.experts.values())

    def lru_state_on(self, where: str) -> None:
        """Hand every layer's LRU slot state to the "host" (one read for all layers) or the "device" (no-op
        where it already is)."""
        lru_state_on(self.experts.values(), where)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden, self.lm_head).float()
