"""Paged attention in Triton with the same fixed order as `kv_cache.paged_attention` (CUDA only).

One program per (16-row query tile aligned on absolute positions, query head): it walks the sequence's
key blocks in order with an online softmax in float32 (`tl.dot` in IEEE precision), values past the
sequence end zeroed. A program reads only its own rows and the blocks up to its last row, so a token's
output is the same whether its prefix was cached, chunked, recomputed or decoded, and whatever else is
in the batch. The numbers differ slightly from the torch path's (which rounds scores to the model dtype);
each path is exact within itself.

Every tile is described by a row of `meta` [tiles, 5] int32: (row of its sequence in `tables`, start,
end, first position of the tile, row of position `start` in q). One sequence's chunk
(`triton_paged_attention`) and a whole decode batch whose metadata is computed on the device
(`decode_attention`, capturable in a CUDA graph) launch the same kernel, so their bits agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.rows import ROW_TILE


@triton.jit
def _paged_attn(q_ptr, k_ptr, v_ptr, tables_ptr, s_tab, meta_ptr, out_ptr, group, scale, window,
                s_qt, s_qh, s_kb, s_kh, s_kp, s_ot, s_oh,
                R: tl.constexpr, BS: tl.constexpr, HD: tl.constexpr, HAS_WINDOW: tl.constexpr):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    meta = meta_ptr + tile * 5
    table_ptr = tables_ptr + tl.load(meta).to(tl.int64) * s_tab
    start = tl.load(meta + 1)
    end = tl.load(meta + 2)
    first = tl.load(meta + 3)
    q_row0 = tl.load(meta + 4)
    kvh = head // group
    pos = first + tl.arange(0, R)  # absolute positions of the tile's rows
    row_ok = (pos >= start) & (pos < end)
    d = tl.arange(0, HD)
    q_rows = (q_row0 + pos - start).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * s_qt + head * s_qh + d[None, :], mask=row_ok[:, None], other=0.0)
    q = q.to(tl.float32)
    m = tl.full((R,), float("-inf"), tl.float32)
    denom = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, HD), tl.float32)
    last = tl.minimum(end, first + R) - 1
    for j in range(0, last // BS + 1):
        blk = tl.load(table_ptr + j).to(tl.int64)
        kpos = j * BS + tl.arange(0, BS)
        live = kpos < end
        base = blk * s_kb + kvh * s_kh + tl.arange(0, BS)[:, None] * s_kp + d[None, :]
        k = tl.load(k_ptr + base).to(tl.float32)
        v = tl.load(v_ptr + base, mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [R, BS]
        allowed = (kpos[None, :] <= pos[:, None]) & live[None, :]
        if HAS_WINDOW:
            allowed = allowed & (kpos[None, :] > pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        corr = tl.exp(m - m_safe)
        denom = denom * corr + tl.sum(p, axis=1)
        acc = acc * corr[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    out = acc / denom[:, None]
    tl.store(out_ptr + q_rows[:, None] * s_ot + head * s_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def _launch(q, k_cache, v_cache, tables, meta, window) -> torch.Tensor:
    h, hd = q.shape[1], q.shape[2]
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    q = q.contiguous()
    out = torch.empty_like(q)
    _paged_attn[(meta.shape[0], h)](
        q, k_cache, v_cache, tables, tables.stride(0), meta, out, h // hkv, hd**-0.5, window or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1),
        R=ROW_TILE, BS=bs, HD=hd, HAS_WINDOW=window is not None,
    )
    return out


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: list[int],
                           start: int, window: int | None = None) -> torch.Tensor:
    """q [n, H, hd] at positions start..; k_cache/v_cache [NB, Hkv, bs, hd] (one layer) -> [n, H, hd]."""
    end = start + q.shape[0]
    first = start - start % ROW_TILE
    meta = [[0, start, end, f, 0] for f in range(first, end, ROW_TILE)]
    tables = torch.tensor([table], dtype=torch.int32, device=q.device)
    return _launch(q, k_cache, v_cache, tables, torch.tensor(meta, dtype=torch.int32, device=q.device), window)


@triton.jit
def _write_kv(k_ptr, v_ptr, k_cache, v_cache, blocks_ptr, offs_ptr, s_t, s_h, s_kb, s_kh, s_kp, Hkv,
              HD: tl.constexpr):
    pid = tl.program_id(0)  # token * Hkv + head
    token, head = pid // Hkv, pid % Hkv
    d = tl.arange(0, HD)
    dst = tl.load(blocks_ptr + token).to(tl.int64) * s_kb + head * s_kh + tl.load(offs_ptr + token).to(tl.int64) * s_kp + d
    src = token.to(tl.int64) * s_t + head * s_h + d
    tl.store(k_cache + dst, tl.load(k_ptr + src))
    tl.store(v_cache + dst, tl.load(v_ptr + src))


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
             offsets: torch.Tensor) -> None:
    """k, v [B, Hkv, hd] into one layer's cache [NB, Hkv, bs, hd] at (blocks[b], :, offsets[b]): one launch
    doing what `cache[blocks, :, offsets] = k` does (a plain copy, so the bytes are the same)."""
    b, hkv, hd = k.shape
    k, v = k.contiguous(), v.contiguous()
    _write_kv[(b * hkv,)](k, v, k_cache, v_cache, blocks, offsets, k.stride(0), k.stride(1), k_cache.stride(0),
                          k_cache.stride(1), k_cache.stride(2), hkv, HD=hd)


def decode_meta(positions: torch.Tensor) -> torch.Tensor:
    """The tile metadata [B, 5] of a decode batch (row b: sequence b's one token at positions[b]), on the device."""
    pos = positions.to(torch.int32)
    rows = torch.arange(pos.shape[0], dtype=torch.int32, device=pos.device)
    return torch.stack([rows, pos, pos + 1, pos - pos % ROW_TILE, rows], dim=1).contiguous()


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                     meta: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """q [B, H, hd] (one token per sequence), tables [B, max_blocks] int32, meta from `decode_meta`."""
    return _launch(q, k_cache, v_cache, tables, meta, window)
