"""Multi-head latent attention (DeepSeek-V2), computed on the compressed cache ("absorbed").

Shapes (`wisp.config.MlaShape`): H heads; per head a query of nope_dim + rope_dim and a value of v_dim; a latent of
kv_lora_rank per token. Per token and layer:
    latent = norm(kv_a(x)[:kv_lora_rank]),  k_rope = rope(kv_a(x)[kv_lora_rank:])   (one rope key for all heads)
    q = q_proj(x) (or q_b(norm(q_a(x)))), per head [q_nope | q_rope], q_rope = rope(q_rope)
    k_h = [W_uk_h latent | k_rope],  v_h = W_uv_h latent  (W_uk, W_uv: kv_b_proj's per-head blocks)
    score_h(j) = scale * (q_nope_h . W_uk_h latent_j + q_rope_h . k_rope_j)
                = scale * ([W_uk_h^T q_nope_h | q_rope_h] . [latent_j | k_rope_j])
So the KV cache holds one entry per token, `[latent | k_rope]` (kv_lora_rank + rope_dim values: 576 for
DeepSeek-V2-Lite against 2 x 16 x 192 for its expanded keys and values), read by every head as one shared
key (MQA with one KV head), and also as the value: the attention output's first kv_lora_rank values are the
latent's softmax average, which W_uv_h takes to the head's value. The cache's values alias its keys
(`KVCache(keys_only=True, value_dim=kv_lora_rank)`); a KV block costs layers x block_size x (kv_lora_rank +
rope_dim) x element bytes. `kv.write_attend` picks the kernel: on the torch path `paged_attention` over the whole
entry (its rope columns averaged too, then dropped); with the Triton backend (CUDA) the latent kernels of
`wisp.engine.triton_mla_attention` (the latent and rope parts as two products, the latent read once as key and
value, all heads of a token in one program; zeros in the rope columns), prefill and the decode launch that CUDA
graphs capture. Either way the first kv_lora_rank output columns are the latent's average, the only ones read.

The rope rotates interleaved pairs (x[2i], x[2i+1]) in DeepSeek's layout; the loader permutes the rope rows of
q and kv_a (evens, then odds) so the half-split rotation the other families use computes the same scores.
`softmax_scale` is (nope_dim + rope_dim)^-0.5, times mscale(factor, mscale_all_dim)^2 under yarn.
Every per-token op is row-invariant (`wisp.core.kernels.rows`), so batch invariance holds as for the other families.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wisp.config import MlaShape
from wisp.core.kernels import rows


@dataclass
class MlaWeights:
    kv_a: torch.Tensor  # [kv_lora_rank + rope_dim, D] (rope rows de-interleaved)
    kv_a_norm: torch.Tensor  # [kv_lora_rank]
    w_uk: torch.Tensor  # [H, nope_dim, kv_lora_rank]
    w_uv: torch.Tensor  # [H, v_dim, kv_lora_rank]
    o: torch.Tensor  # [D, H * v_dim]
    q: torch.Tensor | None = None  # [H * (nope + rope), D], or the LoRA pair below
    q_a: torch.Tensor | None = None  # [q_lora_rank, D]
    q_a_norm: torch.Tensor | None = None
    q_b: torch.Tensor | None = None  # [H * (nope + rope), q_lora_rank]
    q_a_bias: torch.Tensor | None = None
    kv_a_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None


LORA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: transformers builds them with the default eps


def deinterleave_rope_rows(weight: torch.Tensor, start: int, rope_dim: int, period: int) -> torch.Tensor:
    """weight's rows with, in every `period` rows from `start`, the rope_dim rows reordered evens then odds
    (a projection's rope outputs as the half-split rotation expects them)."""
    out = weight.clone()
    for base in range(start, weight.shape[0], period):
        block = weight[base : base + rope_dim]
        out[base : base + rope_dim] = torch.cat([block[0::2], block[1::2]])
    return out


def load_mla_weights(key, dev, opt, shape: MlaShape, num_heads: int) -> MlaWeights:
    """A layer's latent-attention weights: key(name) is a tensor's checkpoint key, dev/opt read one (opt: None
    when absent). The rope rows are de-interleaved here, kv_b split into its per-head key and value blocks."""
    q_out_period, r = shape.nope_dim + shape.rope_dim, shape.kv_lora_rank

    def q_rows(w: torch.Tensor) -> torch.Tensor:
        return deinterleave_rope_rows(w, shape.nope_dim, shape.rope_dim, q_out_period)

    def kv_rows(w: torch.Tensor | None) -> torch.Tensor | None:
        return None if w is None else deinterleave_rope_rows(w, r, shape.rope_dim, shape.cache_dim)

    kv_b = dev(key("kv_b_proj.weight")).view(num_heads, shape.nope_dim + shape.v_dim, r)
    w = MlaWeights(kv_a=kv_rows(dev(key("kv_a_proj_with_mqa.weight"))), kv_a_norm=dev(key("kv_a_layernorm.weight")),
                   w_uk=kv_b[:, : shape.nope_dim].contiguous(), w_uv=kv_b[:, shape.nope_dim :].contiguous(),
                   o=dev(key("o_proj.weight")), kv_a_bias=kv_rows(opt(key("kv_a_proj_with_mqa.bias"))),
                   o_bias=opt(key("o_proj.bias")))
    if shape.q_lora_rank is None:
        w.q = q_rows(dev(key("q_proj.weight")))
    else:
        w.q_a, w.q_a_norm, w.q_a_bias = dev(key("q_a_proj.weight")), dev(key("q_a_layernorm.weight")), opt(key("q_a_proj.bias"))
        w.q_b = q_rows(dev(key("q_b_proj.weight")))
    return w


def mla_attention(decoder, li: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv) -> torch.Tensor:
    """x [T, D] (normed) -> [T, D]: layer li's latent attention through `kv` (the decoder's KV view)."""
    cfg, w = decoder.config, decoder.layers[li].attn
    shape, t, h = cfg.mla, x.shape[0], cfg.num_heads
    if w.q is not None:
        q = decoder.linear(x, w.q)
    else:
        q_lat = decoder.rms_norm(decoder.linear(x, w.q_a, w.q_a_bias), w.q_a_norm, LORA_NORM_EPS)
        q = decoder.linear(q_lat, w.q_b)
    q = q.view(t, h, shape.nope_dim + shape.rope_dim)
    q_nope, q_rope = q[..., : shape.nope_dim], q[..., shape.nope_dim :]
    kv_a = decoder.linear(x, w.kv_a, w.kv_a_bias)  # [T, kv_lora_rank + rope_dim]
    latent = decoder.rms_norm(kv_a[:, : shape.kv_lora_rank].contiguous(), w.kv_a_norm, LORA_NORM_EPS)
    k_rope = decoder.apply_rope(kv_a[:, None, shape.kv_lora_rank :].contiguous(), *rope)  # [T, 1, rope]
    q_rope = decoder.apply_rope(q_rope.contiguous(), *rope)  # [T, H, rope]
    q_abs = rows.map_row_tiles(q_nope.contiguous(), lambda tile: torch.einsum("thn,hnr->thr", tile, w.w_uk))
    # the kernels scale by cache_dim^-0.5: fold the model's own scale into the query instead
    query = torch.cat([q_abs, q_rope], dim=-1) * (shape.softmax_scale * shape.cache_dim**0.5)  # [T, H, cache_dim]
    entry = torch.cat([latent[:, None, :], k_rope], dim=-1)  # [T, 1, cache_dim]
    out = kv.write_attend(li, query.to(x.dtype), entry, entry, None)[..., : shape.kv_lora_rank]  # [T, H, r]
    v = rows.map_row_tiles(out.contiguous(), lambda tile: torch.einsum("thr,hvr->thv", tile, w.w_uv))
    return decoder.linear(v.reshape(t, h * shape.v_dim), w.o, w.o_bias)
