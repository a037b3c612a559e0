"""The KV cache tensors over the block pool, and attention over a sequence's block table.

`KVCache.k/v`: one [num_blocks, num_kv_heads, block_size, head_dim] tensor per layer on the device (one
per layer, so a live resize reallocates a layer at a time). Position p of a sequence lives in block
`table[p // block_size]` at offset `p % block_size`.

`paged_attention` is the torch path, written for exactness, not speed: queries run in 16-row tiles
aligned on absolute positions and keys in whole blocks, combined with an online softmax in block order.
A query's result is then a fixed computation over keys 0..p alone: extra (masked) blocks add exact
zeros. So a token's attention output is bit-identical whether its prefix came from the prefix cache, a
chunked or whole prefill, a recompute after preemption, or decode, and whatever else shares the batch.
The fast path on CUDA, `wisp.engine.triton_attention` (used with attention="triton" where head_dim and
block_size allow), keeps that guarantee in its own fixed order; its numbers differ slightly from these. A
keys-only cache with a `value_dim` (MLA's latent entry) takes `wisp.engine.triton_mla_attention` there instead.
Attention sinks (GPT-OSS: `sinks` [H], one learned logit per head) join each row's softmax after the keys as a
key of logit `sinks[h]` and value zero: they add to the denominator only.
"""

from __future__ import annotations

import functools

import torch

from wisp.core.kernels.rows import ROW_TILE


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, num_blocks: int, dtype, device,
                 attention: str = "torch", keys_only: bool = False, value_dim: int | None = None):
        self.shape_tail = (num_kv_heads, block_size, head_dim)
        self.keys_only = keys_only  # the values alias the keys (MLA's one compressed entry: `wisp.models.mla`)
        # keys-only: the values are the keys' first value_dim columns (MLA's latent; the rest is its rope key), and
        # the Triton path is the latent kernels (`wisp.engine.triton_mla_attention`); None: the whole keys
        self.value_dim = value_dim if keys_only else None
        self.num_layers, self.block_size, self.dtype, self.device = num_layers, block_size, dtype, torch.device(device)
        self.k = self.v = None
        self.attend_fn = paged_attention
        self.uses_triton = attention == "triton" and _triton_runs_on(self.device) and self._triton_fits(head_dim)
        if self.uses_triton and self.value_dim is not None:
            from wisp.engine.triton_mla_attention import latent_attend

            self.attend_fn = functools.partial(latent_attend, value_dim=self.value_dim)
        elif self.uses_triton:
            from wisp.engine.triton_attention import triton_paged_attention

            self.attend_fn = triton_paged_attention
        self.resize(num_blocks)

    def _triton_fits(self, head_dim: int) -> bool:
        """Whether the Triton kernels take this cache's shape (else the torch path, and no CUDA graphs): blocks of a
        power of two >= 16 keys (tl.arange, tl.dot); a head of 16..256 (another width is padded to a power of two
        with masked lanes; wider would not fit in shared memory), or a latent entry `latent_fits` takes."""
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            return False
        if self.value_dim is not None:
            from wisp.engine.triton_mla_attention import latent_fits

            return self.shape_tail[0] == 1 and latent_fits(head_dim, self.value_dim, self.dtype)
        return 16 <= head_dim <= 256

    @staticmethod
    def block_bytes(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype, tensors: int = 2) -> int:
        """Bytes of one block across layers, K and V (the paper's b); tensors=1 for a keys-only (MLA) cache."""
        return tensors * num_layers * num_kv_heads * block_size * head_dim * torch.empty((), dtype=dtype).element_size()

    def layer_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, *self.shape_tail)

    def resize(self, num_blocks: int) -> None:
        """Reallocate empty (zeroed) tensors of `num_blocks` blocks, the old ones freed first."""
        self.k = self.v = None
        self.k = [torch.zeros(self.layer_shape(num_blocks), dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.v = self.k if self.keys_only else [torch.zeros(self.layer_shape(num_blocks), dtype=self.dtype, device=self.device)
                                                for _ in range(self.num_layers)]
        self.num_blocks = num_blocks

    def resize_keeping(self, num_blocks: int, moves: dict[int, int], keep: int) -> None:
        """Reallocate with `num_blocks` blocks while requests run, keeping blocks 0..keep-1 and placing each
        moved block (old id -> new id, below `keep`) at its new id: `BlockPool.resize_live`'s result.
        One [num_blocks, Hkv, bs, hd] tensor at a time, device to device: the new tensor is filled from the
        old one, then the old one is freed. So on top of the larger of the two pools the device holds one
        layer's K or V (1/(2L) of a pool) at a time, and nothing passes through host memory. If that one
        tensor does not fit (the device is full), that tensor alone waits in host memory while its old
        self is freed, as a resize did before: slower, never out of memory for want of the transient."""
        assert keep <= num_blocks and all(dst < keep for dst in moves.values()), (keep, num_blocks)
        src = torch.tensor(list(moves), dtype=torch.long, device=self.device)
        dst = torch.tensor(list(moves.values()), dtype=torch.long, device=self.device)
        for tensors in (self.k,) if self.keys_only else (self.k, self.v):  # aliased values move with the keys
            for layer in range(len(tensors)):
                tensors[layer] = self._carried(tensors, layer, num_blocks, keep, src, dst)
        self.num_blocks = num_blocks

    def _carried(self, tensors: list, layer: int, num_blocks: int, keep: int, src: torch.Tensor, dst: torch.Tensor
                 ) -> torch.Tensor:
        """tensors[layer] reallocated to num_blocks, its kept and moved blocks carried over (see resize_keeping)."""
        old = tensors[layer]
        try:
            new = torch.zeros(self.layer_shape(num_blocks), dtype=self.dtype, device=self.device)
        except torch.OutOfMemoryError:  # no room for both: the kept blocks wait on the host
            kept, moved = old[:keep].cpu(), old[src].cpu()
            tensors[layer] = old = None  # free the old tensor before allocating the new one
            new = torch.zeros(self.layer_shape(num_blocks), dtype=self.dtype, device=self.device)
            new[:keep].copy_(kept)
            new[dst] = moved.to(self.device)
            return new
        new[:keep].copy_(old[:keep])
        new[dst] = old[src]
        return new


def _triton_runs_on(device: torch.device) -> bool:
    """The Triton kernels run compiled on CUDA, or on the CPU under Triton's interpreter (the tests: the engine
    itself asks for them on CUDA only, `EngineConfig.resolve_backend`)."""
    if device.type == "cuda":
        return True
    from wisp.core.kernels.triton_interpreter import INTERPRETED

    return device.type == "cpu" and INTERPRETED


class BlockTableKV:
    """One sequence's view of the cache: what the model's attention writes to and reads from."""

    def __init__(self, cache: KVCache, block_table: list[int]):
        self.cache = cache
        self.table = block_table

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        """k, v [n, Hkv, hd] for positions start..start+n-1."""
        bs = self.cache.block_size
        pos = torch.arange(start, start + k.shape[0])
        blocks = torch.tensor(self.table, dtype=torch.long)[pos // bs].to(self.cache.device)
        offs = (pos % bs).to(self.cache.device)
        self.cache.k[layer][blocks, :, offs] = k
        self.cache.v[layer][blocks, :, offs] = v

    def attend(self, layer: int, q: torch.Tensor, start: int, window: int | None,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
        return self.cache.attend_fn(q, self.cache.k[layer], self.cache.v[layer], self.table, start, window, sinks)


class DecodeBatchKV:
    """A decode batch's view of the cache with every index on the device (one token per sequence), so
    the step can be captured in a CUDA graph: `tables` [B, max_blocks] int32, `positions` [B] int64.
    Writes land where `BlockTableKV.write` puts them; attention is the Triton kernel's batched launch."""

    def __init__(self, cache: KVCache, tables: torch.Tensor, positions: torch.Tensor):
        from wisp.engine.triton_attention import decode_meta

        self.cache, self.tables, self.positions = cache, tables, positions
        bs = cache.block_size
        self.blocks = tables.gather(1, (positions // bs)[:, None].to(torch.int64))[:, 0].long()  # [B]
        self.offsets = positions % bs  # [B]
        self.meta = decode_meta(positions)

    def cache_slots(self, layer: int):
        """Where the step's keys and values go in `layer`'s cache (`CacheSlots`), for a launch that makes them to
        store them there itself (then `attend`); None for latent attention, whose entry is written apart."""
        from wisp.core.kernels.triton_qkv_heads import CacheSlots

        if self.cache.value_dim is not None:
            return None
        return CacheSlots(self.cache.k[layer], self.cache.v[layer], self.blocks, self.offsets)

    def write_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
        from wisp.engine.triton_attention import write_kv

        write_kv(k, v, self.cache.k[layer], self.cache.v[layer], self.blocks, self.offsets)
        return self.attend(layer, q, window, sinks)

    def attend(self, layer: int, q: torch.Tensor, window: int | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """The step's attention over the cache, its own keys and values written already."""
        from wisp.engine.triton_attention import decode_attention

        if self.cache.value_dim is not None:  # latent attention (values aliasing keys: v is k)
            from wisp.engine.triton_mla_attention import mla_decode_attention

            assert window is None and sinks is None
            return mla_decode_attention(q, self.cache.k[layer], self.tables, self.positions, self.cache.value_dim)
        return decode_attention(q, self.cache.k[layer], self.cache.v[layer], self.tables, self.meta, window, sinks=sinks)


def paged_attention(
    q: torch.Tensor,  # [n, H, hd], positions start..start+n-1
    k_cache: torch.Tensor,  # [NB, Hkv, bs, hd] (one layer)
    v_cache: torch.Tensor,
    table: list[int],
    start: int,
    window: int | None = None,
    sinks: torch.Tensor | None = None,  # [H] per-head sink logits (GPT-OSS)
) -> torch.Tensor:
    n, h, hd = q.shape
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    group = h // hkv
    end = start + n
    first = start - start % ROW_TILE  # query tiles aligned on absolute positions
    n_tiles = -(-(end - first) // ROW_TILE)
    qt = q.new_zeros((n_tiles * ROW_TILE, h, hd))
    qt[start - first : end - first] = q
    qt = qt.view(n_tiles, ROW_TILE, hkv, group, hd).permute(0, 2, 3, 1, 4)  # [T, Hkv, G, R, hd]
    scale = hd**-0.5
    out = torch.empty((n_tiles, hkv, group, ROW_TILE, hd), dtype=q.dtype, device=q.device)
    for t in range(n_tiles):  # one tile at a time: every matmul below has one fixed shape
        qpos = torch.arange(first + t * ROW_TILE, first + (t + 1) * ROW_TILE, device=q.device)[:, None]  # [R, 1]
        m = torch.full((hkv, group, ROW_TILE, 1), float("-inf"), device=q.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros((hkv, group, ROW_TILE, hd), dtype=torch.float32, device=q.device)
        last = min(end, first + (t + 1) * ROW_TILE) - 1
        for j in range(last // bs + 1):
            kpos = torch.arange(j * bs, (j + 1) * bs, device=q.device)
            live = kpos < end  # slots past the sequence end hold stale data: zero their values
            kb = k_cache[table[j]][:, None]  # [Hkv, 1, bs, hd]
            vb = v_cache[table[j]][:, None].float().masked_fill(~live[:, None], 0.0)
            s = torch.matmul(qt[t], kb.transpose(-1, -2)).float() * scale  # [Hkv, G, R, bs]
            allowed = (kpos <= qpos) & live
            if window is not None:
                allowed &= kpos > qpos - window
            s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a row with no key yet
            p = torch.exp(s - m_safe)
            corr = torch.exp(m - m_safe)
            denom = denom * corr + p.sum(-1, keepdim=True)
            acc = acc * corr + torch.matmul(p, vb)
            m = m_new
        if sinks is not None:  # one more key: logit sinks[h], value 0
            sink = sinks.float().view(hkv, group, 1, 1).expand_as(m)
            m_new = torch.maximum(m, sink)
            denom = denom * torch.exp(m - m_new) + torch.exp(sink - m_new)
            acc = acc * torch.exp(m - m_new)
        out[t] = (acc / denom).to(q.dtype)
    out = out.permute(0, 3, 1, 2, 4).reshape(n_tiles * ROW_TILE, h, hd)
    return out[start - first : end - first]
