"""Latent attention (MLA, `wisp.models.mla`) over the paged cache in Triton (CUDA; the CPU runs it in Triton's
interpreter for the tests).

The cache holds one shared KV head whose entry is [latent | rope key], W = value_dim + rope_dim values wide
(512 + 64 for DeepSeek-V2(-Lite)): read once as the key, and its first value_dim columns as the value, from the
same tensor (no copy of the values).
  q [T, H, W]: per head the absorbed query, then the rotated rope query;
  one layer's cache [NB, 1, bs, W];
  out [T, H, W]: columns :value_dim the softmax average of the entries' latents, columns value_dim: zero (the
  decoder's chunked KV view fills a tensor of the query's shape; `mla_attention` reads the first value_dim).

The order every output row is computed in, whoever launches it (that of `wisp.engine.triton_attention`, with the
heads of one token as a tile's rows where that kernel has 16 positions of one head):
  * a program takes one token and a group of ROW_TILE (16) of its heads: head h is row h % 16 of group h // 16,
    whatever else is launched (rows past the last head hold zero queries and are never stored);
  * keys are cut into spans of `span_keys(bs)` positions aligned on absolute position 0; a span is one tile of
    keys, read once for all the group's heads. Its scores are two dot products accumulated in float32, the
    rope part's onto the latent part's (q_lat . k_lat + q_rope . k_rope: a 576-wide entry pads no lane), times
    `scale`; its softmax partial (m, l, acc) in float32 with acc = p . latent, p rounded to the cache's dtype so
    that the one latent tile multiplies on tensor cores in both products (float32 caches, and every cache under
    Triton's interpreter: float32 operands, IEEE); keys past the token's position are never read;
  * the spans' partials are merged in span order 0, 1, 2, ... with `_merge`, then out = acc / l.
So a token's output is a fixed computation over keys 0..p alone: the same whether its prefix was cached,
chunked, recomputed or decoded, and whatever else is in the batch.

Two launches of that arithmetic:
  * `mla_paged_attention` (a sequence's prefill chunk): one program per (token, head group) walks the spans in
    order and merges them as it goes;
  * `mla_decode_attention` (one token per sequence, every index on the device: capturable in a CUDA graph): one
    program per (sequence, head group, g) writes the partials of spans g, g + G, ..., then `_merge_latent_spans`
    merges them in order (G does not change a bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.kernels.rows import ROW_TILE
from wisp.core.kernels.triton_interpreter import ieee_products
from wisp.engine.triton_attention import _merge, padded, span_keys, span_programs

MAX_LATENT_BYTES = 1024  # a latent row's bytes in a tile (512 bf16 values): its span tile stays in shared memory
MAX_ROPE = 64


def _lanes(n: int) -> int:
    """A tile width for n columns: a power of two (tl.arange's), at least 16 (tl.dot's), the extra lanes masked."""
    return max(16, padded(n))


def latent_fits(width: int, value_dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernels take a cache entry of `width` values whose first `value_dim` are the latent."""
    rope = width - value_dim
    return (0 < value_dim and 0 < rope <= MAX_ROPE
            and _lanes(value_dim) * torch.empty((), dtype=dtype).element_size() <= MAX_LATENT_BYTES)


def _launch_options(value_dim: int) -> dict:
    """Warps and stages of every launch (the same for both, so prefill and decode compile the same products):
    no software pipelining of the span loop (a second latent tile in flight would not fit in shared memory)."""
    return dict(num_warps=8 if _lanes(value_dim) >= 256 else 4, num_stages=1)


@triton.jit
def _load_query(q_ptr, token, group, H, s_qt, s_qh,
                R: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr, DR: tl.constexpr, BR: tl.constexpr):
    """The group's query rows: (latent part [R, BL], rope part [R, BR], heads [R], live heads [R])."""
    heads = group * R + tl.arange(0, R)
    live = heads < H
    base = q_ptr + token.to(tl.int64) * s_qt + heads.to(tl.int64)[:, None] * s_qh
    dl = tl.arange(0, BL)
    dr = tl.arange(0, BR)
    q_lat = tl.load(base + dl[None, :], mask=live[:, None] & (dl < DL)[None, :], other=0.0)
    q_rope = tl.load(base + DL + dr[None, :], mask=live[:, None] & (dr < DR)[None, :], other=0.0)
    return q_lat, q_rope, heads, live


@triton.jit
def _latent_span(q_lat, q_rope, cache_ptr, table_ptr, pos, span, scale, s_kb, s_kp,
                 BS: tl.constexpr, SPAN: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr, DR: tl.constexpr,
                 BR: tl.constexpr, WIDE: tl.constexpr):
    """The softmax of the group's rows (one token, at `pos`) over one span's keys, as one tile:
    (m [R], l [R], acc [R, BL]). The latent tile is read once and is both the keys' first part and the values."""
    kpos = span * SPAN + tl.arange(0, SPAN)
    need = kpos <= pos  # keys past the token: never read (the table may end there)
    blk = tl.load(table_ptr + kpos // BS, mask=need, other=0).to(tl.int64)
    row = cache_ptr + blk * s_kb + (kpos % BS).to(tl.int64) * s_kp  # [SPAN] entry starts
    dl = tl.arange(0, BL)
    dr = tl.arange(0, BR)
    lat = tl.load(row[:, None] + dl[None, :], mask=need[:, None] & (dl < DL)[None, :], other=0.0)  # [SPAN, BL]
    rope = tl.load(row[:, None] + DL + dr[None, :], mask=need[:, None] & (dr < DR)[None, :], other=0.0)  # [SPAN, BR]
    if WIDE:
        lat = lat.to(tl.float32)
        s = tl.dot(q_lat.to(tl.float32), tl.trans(lat), input_precision="ieee")
        s = tl.dot(q_rope.to(tl.float32), tl.trans(rope.to(tl.float32)), s, input_precision="ieee")
    else:
        s = tl.dot(q_lat, tl.trans(lat))
        s = tl.dot(q_rope, tl.trans(rope), s)
    s = s * scale  # [R, SPAN]
    s = tl.where(need[None, :], s, float("-inf"))
    m = tl.max(s, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(s - m_safe[:, None])
    if WIDE:
        acc = tl.dot(p, lat, input_precision="ieee")
    else:
        acc = tl.dot(p.to(lat.dtype), lat)
    return m, tl.sum(p, axis=1), acc  # [R], [R], [R, BL]


@triton.jit
def _store_rows(out_ptr, token, heads, live, denom, acc, s_ot, s_oh,
                R: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr, DR: tl.constexpr, BR: tl.constexpr):
    """out = acc / l into the latent columns of the live heads' rows, zeros into their rope columns."""
    out = acc / denom[:, None]  # l >= 1: key 0 is every token's
    base = out_ptr + token.to(tl.int64) * s_ot + heads.to(tl.int64)[:, None] * s_oh
    dl = tl.arange(0, BL)
    dr = tl.arange(0, BR)
    tl.store(base + dl[None, :], out.to(out_ptr.dtype.element_ty), mask=live[:, None] & (dl < DL)[None, :])
    zeros = tl.zeros((R, BR), out_ptr.dtype.element_ty)
    tl.store(base + DL + dr[None, :], zeros, mask=live[:, None] & (dr < DR)[None, :])


@triton.jit
def _latent_attn(q_ptr, cache_ptr, tables_ptr, s_tab, pos_ptr, out_ptr, H, scale, s_qt, s_qh, s_kb, s_kp, s_ot, s_oh,
                 R: tl.constexpr, BS: tl.constexpr, SPAN: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr,
                 DR: tl.constexpr, BR: tl.constexpr, WIDE: tl.constexpr):
    """One program per (token, head group): every span in order, merged as it goes."""
    token = tl.program_id(0)
    group = tl.program_id(1)
    pos = tl.load(pos_ptr + token)
    table_ptr = tables_ptr + token.to(tl.int64) * s_tab
    q_lat, q_rope, heads, live = _load_query(q_ptr, token, group, H, s_qt, s_qh, R, DL, BL, DR, BR)
    m = tl.full((R,), float("-inf"), tl.float32)
    denom = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, BL), tl.float32)
    for span in range(0, pos // SPAN + 1):
        m2, denom2, acc2 = _latent_span(q_lat, q_rope, cache_ptr, table_ptr, pos, span, scale, s_kb, s_kp,
                                        BS, SPAN, DL, BL, DR, BR, WIDE)
        m, denom, acc = _merge(m, denom, acc, m2, denom2, acc2)
    _store_rows(out_ptr, token, heads, live, denom, acc, s_ot, s_oh, R, DL, BL, DR, BR)


@triton.jit
def _latent_span_partials(q_ptr, cache_ptr, tables_ptr, s_tab, pos_ptr, part_m, part_l, part_acc, H, S, scale,
                          s_qt, s_qh, s_kb, s_kp,
                          R: tl.constexpr, BS: tl.constexpr, SPAN: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr,
                          DR: tl.constexpr, BR: tl.constexpr, WIDE: tl.constexpr):
    """Program (token, head group, g) writes the partials of spans g, g + G, ... up to the token's position into
    slot ((token * groups + group) * S + span) * R + row (each span computed alone, so G changes no bit)."""
    token = tl.program_id(0)
    group = tl.program_id(1)
    pos = tl.load(pos_ptr + token)
    table_ptr = tables_ptr + token.to(tl.int64) * s_tab
    q_lat, q_rope, heads, live = _load_query(q_ptr, token, group, H, s_qt, s_qh, R, DL, BL, DR, BR)
    rows = tl.arange(0, R)
    dl = tl.arange(0, BL)
    first = (token * tl.num_programs(1) + group).to(tl.int64) * S
    for span in range(tl.program_id(2), pos // SPAN + 1, tl.num_programs(2)):
        m, denom, acc = _latent_span(q_lat, q_rope, cache_ptr, table_ptr, pos, span, scale, s_kb, s_kp,
                                     BS, SPAN, DL, BL, DR, BR, WIDE)
        at = (first + span) * R + rows  # [R]
        tl.store(part_m + at, m)
        tl.store(part_l + at, denom)
        tl.store(part_acc + at[:, None] * BL + dl[None, :], acc)


@triton.jit
def _merge_latent_spans(pos_ptr, part_m, part_l, part_acc, out_ptr, H, S, s_ot, s_oh,
                        R: tl.constexpr, SPAN: tl.constexpr, DL: tl.constexpr, BL: tl.constexpr, DR: tl.constexpr,
                        BR: tl.constexpr):
    """One program per (token, head group): its spans' partials merged in order, as `_latent_attn` merges them."""
    token = tl.program_id(0)
    group = tl.program_id(1)
    pos = tl.load(pos_ptr + token)
    heads = group * R + tl.arange(0, R)
    rows = tl.arange(0, R)
    dl = tl.arange(0, BL)
    first = (token * tl.num_programs(1) + group).to(tl.int64) * S
    m = tl.full((R,), float("-inf"), tl.float32)
    denom = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, BL), tl.float32)
    for span in range(0, pos // SPAN + 1):
        at = (first + span) * R + rows
        m2 = tl.load(part_m + at)
        denom2 = tl.load(part_l + at)
        acc2 = tl.load(part_acc + at[:, None] * BL + dl[None, :])
        m, denom, acc = _merge(m, denom, acc, m2, denom2, acc2)
    _store_rows(out_ptr, token, heads, heads < H, denom, acc, s_ot, s_oh, R, DL, BL, DR, BR)


def _geometry(q: torch.Tensor, cache: torch.Tensor, value_dim: int) -> dict:
    """The launches' constexprs, after checking the shapes: q [T, H, W], cache [NB, 1, bs, W]."""
    width = q.shape[2]
    assert cache.shape[1] == 1 and cache.shape[3] == width and latent_fits(width, value_dim, cache.dtype), (
        q.shape, cache.shape, value_dim)
    bs = cache.shape[2]
    return dict(R=ROW_TILE, BS=bs, SPAN=span_keys(bs), DL=value_dim, BL=_lanes(value_dim),
                DR=width - value_dim, BR=_lanes(width - value_dim))


def mla_paged_attention(q: torch.Tensor, cache: torch.Tensor, table: list[int], start: int, value_dim: int,
                        scale: float | None = None) -> torch.Tensor:
    """q [n, H, W] at positions start..start+n-1 of one sequence, cache [NB, 1, bs, W] (one layer) -> [n, H, W]
    (see the module docstring). scale: the scores' factor, W^-0.5 unless given (`paged_attention`'s)."""
    n, h, width = q.shape
    geo = _geometry(q, cache, value_dim)
    q = q.contiguous()
    out = torch.empty_like(q)
    positions = torch.arange(start, start + n, dtype=torch.int32, device=q.device)
    tables = torch.tensor([table], dtype=torch.int32, device=q.device)
    _latent_attn[(n, -(-h // ROW_TILE))](
        q, cache, tables, 0, positions, out, h, width**-0.5 if scale is None else scale, q.stride(0), q.stride(1),
        cache.stride(0), cache.stride(2), out.stride(0), out.stride(1),
        **geo, WIDE=ieee_products(q.dtype), **_launch_options(value_dim))
    return out


def mla_decode_attention(q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, positions: torch.Tensor,
                         value_dim: int, scale: float | None = None, programs: int | None = None) -> torch.Tensor:
    """q [B, H, W] (sequence b's one token at positions[b]), tables [B, max_blocks] int32, every index on the
    device -> [B, H, W]: the bits of `mla_paged_attention` on each token, a row's spans read in parallel.
    `programs` overrides `span_programs` (tests)."""
    b, h, width = q.shape
    geo = _geometry(q, cache, value_dim)
    groups = -(-h // ROW_TILE)
    spans = -(-tables.shape[1] * geo["BS"] // geo["SPAN"])  # enough for any position the tables can hold
    q = q.contiguous()
    out = torch.empty_like(q)
    part_m = torch.empty(b * groups * spans * ROW_TILE, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(part_m.shape[0] * geo["BL"], dtype=torch.float32, device=q.device)
    g = programs or span_programs(b, groups, spans, q.device)
    options = _launch_options(value_dim)
    _latent_span_partials[(b, groups, g)](
        q, cache, tables, tables.stride(0), positions, part_m, part_l, part_acc, h, spans,
        width**-0.5 if scale is None else scale, q.stride(0), q.stride(1), cache.stride(0), cache.stride(2),
        **geo, WIDE=ieee_products(q.dtype), **options)
    _merge_latent_spans[(b, groups)](
        positions, part_m, part_l, part_acc, out, h, spans, out.stride(0), out.stride(1),
        R=ROW_TILE, SPAN=geo["SPAN"], DL=value_dim, BL=geo["BL"], DR=geo["DR"], BR=geo["BR"], **options)
    return out


def latent_attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: list[int], start: int,
                  window: int | None = None, sinks: torch.Tensor | None = None, *, value_dim: int) -> torch.Tensor:
    """`mla_paged_attention` with `KVCache.attend_fn`'s signature: the values are the keys (an aliased cache);
    latent attention has no window and no sinks."""
    assert v_cache is k_cache and window is None and sinks is None
    return mla_paged_attention(q, k_cache, table, start, value_dim)
