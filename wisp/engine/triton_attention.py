"""Paged attention in Triton with a fixed, position-aligned order of arithmetic (CUDA; the CPU runs it in
Triton's interpreter for the tests).

The order every output row is computed in, whoever launches it:
  * keys are cut into spans of `span_keys(bs)` positions aligned on absolute position 0 (64 keys, or one
    block when blocks are larger);
  * a span is one tile of keys: scores q . k accumulated in float32 (16-bit operands multiply exactly on
    tensor cores), its softmax partial (m, l, acc) in float32 with p entering the values' product in TF32
    (float32 models, and Triton's interpreter: IEEE), values past the sequence end zeroed;
  * the spans' partial (m, l, acc) are merged in span order 0, 1, 2, ... with `_merge`, then out = acc / l.
A row's keys past its own position are masked, and a masked block or span changes no bit of the state, so
a token's output is the same whether its prefix was cached, chunked, recomputed or decoded, and whatever
else is in the batch. The numbers differ slightly from the torch path's (which rounds scores to the model
dtype); each path is exact within itself.

Every query tile (16 rows aligned on absolute positions) is described by a row of `meta` [tiles, 5] int32:
(row of its sequence in `tables`, start, end, first position of the tile, row of position `start` in q).
Two launches of the same arithmetic:
  * `triton_paged_attention` (a sequence's prefill chunk): one program per (tile, head) walks the spans in
    order and merges them as it goes;
  * `decode_attention` (one token per sequence, metadata on the device, capturable in a CUDA graph): one
    program per (sequence, head, span) writes its span's partial, and `_merge_spans` merges them in order,
    so a long context is read by many programs at once (flash-decoding with a fixed split).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from wisp.core.kernels.rows import ROW_TILE
from wisp.core.kernels.triton_interpreter import ieee_products

SPAN_KEYS = 64  # keys per span: fixed, since the span boundaries are part of every row's arithmetic


def span_keys(block_size: int) -> int:
    """The span length for a cache of `block_size`-key blocks (a whole number of blocks)."""
    return max(SPAN_KEYS, block_size)


@triton.jit
def _tile(meta_ptr, tile, R: tl.constexpr):
    """A tile's metadata: (row of its table, start, end, first position, q row of start, the positions of
    its rows, which rows are live, the last position any live row needs)."""
    meta = meta_ptr + tile * 5
    seq = tl.load(meta)
    start = tl.load(meta + 1)
    end = tl.load(meta + 2)
    first = tl.load(meta + 3)
    q_row0 = tl.load(meta + 4)
    pos = first + tl.arange(0, R)
    row_ok = (pos >= start) & (pos < end)
    last = tl.minimum(end, first + R) - 1
    return seq, start, end, q_row0, pos, row_ok, last


@triton.jit
def _span(q, k_ptr, v_ptr, table_ptr, kvh, pos, end, last, span, window, scale,
          s_kb, s_kh, s_kp, R: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr, SPAN: tl.constexpr,
          HAS_WINDOW: tl.constexpr, DM: tl.constexpr, WIDE: tl.constexpr):
    """The softmax of the tile's rows over one span's SPAN keys, as one tile: (m [R], l [R], acc [R, HD]).
    Scores are q . k in float32 (16-bit operands multiply exactly on tensor cores; WIDE: float32 operands,
    IEEE); the values' product takes p in TF32 (10-bit mantissa) unless WIDE."""
    d = tl.arange(0, HD)
    kpos = span * SPAN + tl.arange(0, SPAN)
    need = kpos <= last  # keys past every live row's position: never read (the table may end there)
    blk = tl.load(table_ptr + kpos // BS, mask=need, other=0).to(tl.int64)
    base = blk[:, None] * s_kb + kvh * s_kh + (kpos % BS)[:, None] * s_kp + d[None, :]
    dm = (d < DM)[None, :]  # DM < HD: zero padding
    k = tl.load(k_ptr + base, mask=need[:, None] & dm, other=0.0)
    v = tl.load(v_ptr + base, mask=(need & (kpos < end))[:, None] & dm, other=0.0)  # stale slots: zero values
    if WIDE:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * scale  # [R, SPAN]
    allowed = (kpos[None, :] <= pos[:, None]) & (kpos < end)[None, :]
    if HAS_WINDOW:
        allowed = allowed & (kpos[None, :] > pos[:, None] - window)
    s = tl.where(allowed, s, float("-inf"))
    m = tl.max(s, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(s - m_safe[:, None])
    if WIDE:
        acc = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(p, v.to(tl.float32), input_precision="tf32")
    return m, tl.sum(p, axis=1), acc


@triton.jit
def _merge(m, denom, acc, m2, denom2, acc2):
    """Two partial softmaxes of the same rows as one; a (-inf, 0, 0) side changes no bit of the other."""
    m_new = tl.maximum(m, m2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp(m - m_safe)
    b = tl.exp(m2 - m_safe)
    return m_new, denom * a + denom2 * b, acc * a[:, None] + acc2 * b[:, None]


@triton.jit
def _with_sink(m, denom, acc, sinks_ptr, head, HAS_SINKS: tl.constexpr):
    """The softmax with the head's sink logit joined as one more key of value zero (GPT-OSS)."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) + 0.0 * m
        m, denom, acc = _merge(m, denom, acc, sink, 1.0 + 0.0 * denom, 0.0 * acc)
    return m, denom, acc


@triton.jit
def _load_q(q_ptr, q_row0, pos, start, row_ok, head, s_qt, s_qh, HD: tl.constexpr, DM: tl.constexpr):
    q_rows = (q_row0 + pos - start).to(tl.int64)
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + q_rows[:, None] * s_qt + head * s_qh + d[None, :], mask=row_ok[:, None] & (d < DM)[None, :],
                other=0.0)
    return q, q_rows


@triton.jit
def _paged_attn(q_ptr, k_ptr, v_ptr, tables_ptr, s_tab, meta_ptr, out_ptr, group, scale, window, sinks_ptr,
                s_qt, s_qh, s_kb, s_kh, s_kp, s_ot, s_oh,
                R: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr, SPAN: tl.constexpr, HAS_WINDOW: tl.constexpr,
                HAS_SINKS: tl.constexpr, DM: tl.constexpr, WIDE: tl.constexpr):
    """One program per (tile, head): every span in order, merged as it goes."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq, start, end, q_row0, pos, row_ok, last = _tile(meta_ptr, tile, R)
    table_ptr = tables_ptr + seq.to(tl.int64) * s_tab
    q, q_rows = _load_q(q_ptr, q_row0, pos, start, row_ok, head, s_qt, s_qh, HD, DM)
    m = tl.full((R,), float("-inf"), tl.float32)
    denom = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, HD), tl.float32)
    for span in range(0, last // SPAN + 1):
        m2, denom2, acc2 = _span(q, k_ptr, v_ptr, table_ptr, head // group, pos, end, last, span, window, scale,
                                 s_kb, s_kh, s_kp, R, BS, HD, SPAN, HAS_WINDOW, DM, WIDE)
        m, denom, acc = _merge(m, denom, acc, m2, denom2, acc2)
    m, denom, acc = _with_sink(m, denom, acc, sinks_ptr, head, HAS_SINKS)
    out = acc / tl.where(row_ok, denom, 1.0)[:, None]  # dead rows (not stored) divide by 1, not 0
    d = tl.arange(0, HD)
    tl.store(out_ptr + q_rows[:, None] * s_ot + head * s_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (d < DM)[None, :])


@triton.jit
def _span_partials(q_ptr, k_ptr, v_ptr, tables_ptr, s_tab, meta_ptr, part_m, part_l, part_acc, group, scale, window,
                   s_qt, s_qh, s_kb, s_kh, s_kp, H, S,
                   R: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr, SPAN: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, DM: tl.constexpr, WIDE: tl.constexpr):
    """Program (tile of one live row, head, g) writes the partials of spans g, g + G, g + 2G, ... up to the
    row's position (G programs per row; each span is computed alone, so G does not change a bit)."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq, start, end, q_row0, pos, row_ok, last = _tile(meta_ptr, tile, R)
    table_ptr = tables_ptr + seq.to(tl.int64) * s_tab
    q, q_rows = _load_q(q_ptr, q_row0, pos, start, row_ok, head, s_qt, s_qh, HD, DM)
    d = tl.arange(0, HD)
    for span in range(tl.program_id(2), last // SPAN + 1, tl.num_programs(2)):
        m, denom, acc = _span(q, k_ptr, v_ptr, table_ptr, head // group, pos, end, last, span, window, scale,
                              s_kb, s_kh, s_kp, R, BS, HD, SPAN, HAS_WINDOW, DM, WIDE)
        at = (tile * H + head).to(tl.int64) * S + span  # the live row's slot; the other rows are masked
        tl.store(part_m + at + 0 * pos, m, mask=row_ok)
        tl.store(part_l + at + 0 * pos, denom, mask=row_ok)
        tl.store(part_acc + at * HD + 0 * pos[:, None] + d[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _merge_spans(meta_ptr, part_m, part_l, part_acc, out_ptr, sinks_ptr, s_ot, s_oh, H, S,
                 R: tl.constexpr, HD: tl.constexpr, SPAN: tl.constexpr, HAS_SINKS: tl.constexpr, DM: tl.constexpr):
    """One program per (tile of one live row, head): the spans' partials merged in order, as `_paged_attn`
    merges them, on the same [R] / [R, HD] shapes (the dead rows stay at (-inf, 0, 0))."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq, start, end, q_row0, pos, row_ok, last = _tile(meta_ptr, tile, R)
    d = tl.arange(0, HD)
    m = tl.full((R,), float("-inf"), tl.float32)
    denom = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, HD), tl.float32)
    base = (tile * H + head).to(tl.int64) * S
    for span in range(0, last // SPAN + 1):
        m2 = tl.load(part_m + base + span + 0 * pos, mask=row_ok, other=float("-inf"))
        denom2 = tl.load(part_l + base + span + 0 * pos, mask=row_ok, other=0.0)
        acc2 = tl.load(part_acc + (base + span) * HD + 0 * pos[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        m, denom, acc = _merge(m, denom, acc, m2, denom2, acc2)
    m, denom, acc = _with_sink(m, denom, acc, sinks_ptr, head, HAS_SINKS)
    out = acc / tl.where(row_ok, denom, 1.0)[:, None]
    q_rows = (q_row0 + pos - start).to(tl.int64)
    tl.store(out_ptr + q_rows[:, None] * s_ot + head * s_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (d < DM)[None, :])


def padded(hd: int) -> int:
    """The kernels' head width: hd up to a power of two (tl.arange's), the extra lanes masked to zeros."""
    return 1 << (hd - 1).bit_length()


def _strides(q, k_cache):
    return (q.stride(0), q.stride(1)), (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))


def _launch(q, k_cache, v_cache, tables, meta, window, sinks=None) -> torch.Tensor:
    h, hd = q.shape[1], q.shape[2]
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    q = q.contiguous()
    out = torch.empty_like(q)
    (s_qt, s_qh), (s_kb, s_kh, s_kp) = _strides(q, k_cache)
    _paged_attn[(meta.shape[0], h)](
        q, k_cache, v_cache, tables, tables.stride(0), meta, out, h // hkv, hd**-0.5, window or 0,
        q if sinks is None else sinks, s_qt, s_qh, s_kb, s_kh, s_kp, out.stride(0), out.stride(1),
        R=ROW_TILE, BS=bs, HD=padded(hd), SPAN=span_keys(bs), HAS_WINDOW=window is not None,
        HAS_SINKS=sinks is not None, DM=hd, WIDE=ieee_products(q.dtype),
    )
    return out


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: list[int],
                           start: int, window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [n, H, hd] at positions start..; k_cache/v_cache [NB, Hkv, bs, hd] (one layer) -> [n, H, hd]."""
    end = start + q.shape[0]
    first = start - start % ROW_TILE
    meta = [[0, start, end, f, 0] for f in range(first, end, ROW_TILE)]
    tables = torch.tensor([table], dtype=torch.int32, device=q.device)
    return _launch(q, k_cache, v_cache, tables, torch.tensor(meta, dtype=torch.int32, device=q.device), window, sinks)


def decode_meta(positions: torch.Tensor) -> torch.Tensor:
    """The tile metadata [B, 5] of a decode batch (row b: sequence b's one token at positions[b]), on the device."""
    pos = positions.to(torch.int32)
    rows = torch.arange(pos.shape[0], dtype=torch.int32, device=pos.device)
    return torch.stack([rows, pos, pos + 1, pos - pos % ROW_TILE, rows], dim=1).contiguous()


def span_programs(batch: int, heads: int, spans: int, device: torch.device) -> int:
    """How many programs share a row's spans (span s goes to program s mod this): enough to fill the GPU.
    Launch geometry only: each span's partial is computed alone and merged in span order, so the bits do
    not depend on it."""
    return max(1, min(spans, -(-4 * _multiprocessors(device) // (batch * heads))))


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                     meta: torch.Tensor, window: int | None = None, programs: int | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, hd] (one token per sequence), tables [B, max_blocks] int32, meta from `decode_meta`:
    the same bits as `triton_paged_attention` on each token, with a row's spans read in parallel.
    `programs` overrides `span_programs` (tests)."""
    b, h, hd = q.shape
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    span = span_keys(bs)
    spans = -(-tables.shape[1] * bs // span)  # enough for any position the tables can hold
    q = q.contiguous()
    out = torch.empty_like(q)
    part_m = torch.empty(b * h * spans, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(b * h * spans * padded(hd), dtype=torch.float32, device=q.device)
    (s_qt, s_qh), (s_kb, s_kh, s_kp) = _strides(q, k_cache)
    g = programs or span_programs(b, h, spans, q.device)
    _span_partials[(b, h, g)](
        q, k_cache, v_cache, tables, tables.stride(0), meta, part_m, part_l, part_acc, h // hkv, hd**-0.5,
        window or 0, s_qt, s_qh, s_kb, s_kh, s_kp, h, spans,
        R=ROW_TILE, BS=bs, HD=padded(hd), SPAN=span, HAS_WINDOW=window is not None, DM=hd, WIDE=ieee_products(q.dtype),
    )
    _merge_spans[(b, h)](meta, part_m, part_l, part_acc, out, q if sinks is None else sinks, out.stride(0),
                         out.stride(1), h, spans, R=ROW_TILE, HD=padded(hd), SPAN=span, HAS_SINKS=sinks is not None,
                         DM=hd)
    return out


@triton.jit
def _write_kv(k_ptr, v_ptr, k_cache, v_cache, blocks_ptr, offs_ptr, s_t, s_h, s_kb, s_kh, s_kp, Hkv,
              HD: tl.constexpr, DM: tl.constexpr):
    pid = tl.program_id(0)  # token * Hkv + head
    token, head = pid // Hkv, pid % Hkv
    d = tl.arange(0, HD)
    ok = d < DM
    dst = tl.load(blocks_ptr + token).to(tl.int64) * s_kb + head * s_kh + tl.load(offs_ptr + token).to(tl.int64) * s_kp + d
    src = token.to(tl.int64) * s_t + head * s_h + d
    tl.store(k_cache + dst, tl.load(k_ptr + src, mask=ok), mask=ok)
    tl.store(v_cache + dst, tl.load(v_ptr + src, mask=ok), mask=ok)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
             offsets: torch.Tensor) -> None:
    """k, v [B, Hkv, hd] into one layer's cache [NB, Hkv, bs, hd] at (blocks[b], :, offsets[b]): one launch
    doing what `cache[blocks, :, offsets] = k` does (a plain copy, so the bytes are the same)."""
    b, hkv, hd = k.shape
    k, v = k.contiguous(), v.contiguous()
    _write_kv[(b * hkv,)](k, v, k_cache, v_cache, blocks, offsets, k.stride(0), k.stride(1), k_cache.stride(0),
                          k_cache.stride(1), k_cache.stride(2), hkv, HD=padded(hd), DM=hd)
