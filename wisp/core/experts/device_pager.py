"""The paging decision on the GPU: one step of `ExpertPager.prepare` with no host round trip (CUDA only).

The device state of one pager (`DeviceLRU`, plus the pager's `expert_map`): `expert_map` [N] expert ->
slot or -1, `expert_in_slot` [C] slot -> expert or -1, `last_used` [C] the touch number of each slot's
latest touch, `touch_count` [1] the touches so far; the same fields as `wisp.core.experts.pager`'s host state.

Two launches per token group, both capturable in a CUDA graph:
1. `_lru_decide` (one program): from the group's routed ids [P] and that state it finds the distinct
   routed experts, the misses, the ones kept, and their victims, and rewrites the state in place: exactly
   `ExpertPager.prepare`'s rule (misses in ascending id order take the least recently used slots the
   step does not need, ordered by (last_used, slot); then every routed expert is touched in
   `wisp.core.experts.recency`'s order: by the last of the group's tokens routing to it, then id). It writes
   the miss list (expert, slot) and its length, and adds the step to the device counters [steps, hits,
   misses, evictions, loads, bytes].
2. `_copy_misses`: programs (miss i, chunk c) copy chunk c of expert miss_e[i]'s bytes from the pinned
   host master, read in place through unified virtual addressing, into slot miss_s[i]; programs past
   the miss count exit at once. So only the missed experts' bytes cross PCIe, with no host sync.

A wide step (more distinct routed experts than C) takes the same decision, `ExpertPager.decide`'s rule: its C
most recent experts are kept (misses among them loaded into the least recently used slots not holding a kept
hit), its other misses are streamed. `DeviceLRU.decide_wide` writes, besides the state, a `WideDecision`:
the hits' slots before the step, the loads' slots, and the streamed misses cut into waves of the staging
rows, each with its map; `wisp.core.experts.expert_major_on_device` copies and computes from them.

Precondition of `prepare` (the caller's): the group routes to at most C distinct experts (groups of C // top_k
tokens guarantee it); `decide_wide` has none. Invariant: after `DeviceLRU.prepare` (called by
`ExpertPager.prepare_on_device`) or `decide_wide`, the device state and counts equal what the host pager would
hold after `prepare` / `decide` of the same ids in touch order (tests/core/experts/test_device_pager.py and
test_expert_major_on_device.py: on the GPU, and elsewhere under Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.experts.counters import COUNT_FIELDS
from wisp.core.kernels.triton_step_count import bump as _bump
from wisp.core.kernels.uva import device_view


@triton.jit
def _lru_decide(ids_ptr, n_pairs, top_k, expert_map_ptr, expert_in_slot_ptr, last_used_ptr, touch_count_ptr,
                miss_e_ptr, miss_s_ptr, n_miss_ptr, count_ptr, N, C, expert_bytes,
                stream_e_ptr, n_stream_ptr, hit_map_ptr, load_map_ptr, wave_map_ptr, ROWS, WAVES,
                BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
                WIDE: tl.constexpr):
    p = tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=-1).to(tl.int32)
    e = tl.arange(0, BLOCK_E)
    e_ok = e < N
    routes = ids[None, :] == e[:, None]  # [E, P]
    need = (tl.max(routes.to(tl.int32), axis=1) > 0) & e_ok  # [E]
    last_token = tl.max(tl.where(routes, p[None, :] // top_k, -1), axis=1)  # [E]
    # recency key (last token, id), distinct per expert; a needed expert's rank among the needed by it
    key = last_token * BLOCK_E + e
    touch_order_rank = tl.sum(((key[None, :] < key[:, None]) & need[None, :]).to(tl.int32), axis=1)  # [E]
    slot_of = tl.load(expert_map_ptr + e, mask=e_ok, other=-1)
    n_need = tl.sum(need.to(tl.int32), axis=0)
    kept = need & (touch_order_rank >= n_need - C)  # the step's C most recent (all of a narrow step's)
    miss = need & (slot_of < 0)
    hit = need & (slot_of >= 0)
    n_miss = tl.sum(miss.to(tl.int32), axis=0)
    load = miss & kept  # misses copied into a slot and kept, in ascending id
    streamed = miss & (kept == 0)  # a wide step's other misses: through the staging rows, not kept
    load_rank = tl.cumsum(load.to(tl.int32), axis=0) - 1
    n_load = tl.sum(load.to(tl.int32), axis=0)

    s = tl.arange(0, BLOCK_C)
    s_ok = s < C
    expert_in_slot = tl.load(expert_in_slot_ptr + s, mask=s_ok, other=-1)
    last_used = tl.load(last_used_ptr + s, mask=s_ok, other=0)
    at = slot_of[:, None] == s[None, :]  # [E, C]: expert e sits in slot s
    kept_slot = tl.max((at & (hit & kept)[:, None]).to(tl.int32), axis=0) > 0
    cand = s_ok & (kept_slot == 0)
    # a candidate's rank in (last_used, slot) order among the candidates
    before, tied = last_used[None, :] < last_used[:, None], last_used[None, :] == last_used[:, None]
    earlier = before | (tied & (s[None, :] < s[:, None]))
    cand_rank = tl.sum((earlier & cand[None, :]).to(tl.int32), axis=1)
    take = cand & (cand_rank < n_load)
    match = load[:, None] & take[None, :] & (load_rank[:, None] == cand_rank[None, :])  # [E, C]
    new_e_of_s = tl.sum(tl.where(match, e[:, None], 0), axis=0)
    new_s_of_e = tl.sum(tl.where(match, s[None, :], 0), axis=1)
    evicted_e = tl.max((at & take[None, :]).to(tl.int32), axis=1) > 0
    n_evict = tl.sum((take & (expert_in_slot >= 0)).to(tl.int32), axis=0)
    new_slot_of = tl.where(load, new_s_of_e, tl.where(evicted_e, -1, slot_of))
    new_expert_in_slot = tl.where(take, new_e_of_s, expert_in_slot)
    touch_count = tl.load(touch_count_ptr)
    touched = need[:, None] & (new_slot_of[:, None] == s[None, :])  # [E, C]
    touch_s = tl.max(touched.to(tl.int32), axis=0) > 0
    touch_rank = tl.sum(tl.where(touched, touch_order_rank[:, None], 0), axis=0)
    new_last_used = tl.where(touch_s, touch_count + touch_rank.to(tl.int64), last_used)

    tl.store(expert_map_ptr + e, new_slot_of, mask=e_ok)
    tl.store(expert_in_slot_ptr + s, new_expert_in_slot, mask=s_ok)
    tl.store(last_used_ptr + s, new_last_used, mask=s_ok)
    tl.store(touch_count_ptr, touch_count + n_need.to(tl.int64))
    tl.store(miss_e_ptr + cand_rank, new_e_of_s, mask=take)
    tl.store(miss_s_ptr + cand_rank, s, mask=take)
    tl.store(n_miss_ptr, n_load)
    if WIDE:
        stream_rank = tl.cumsum(streamed.to(tl.int32), axis=0) - 1
        tl.store(stream_e_ptr + stream_rank, e, mask=streamed)
        tl.store(n_stream_ptr, tl.sum(streamed.to(tl.int32), axis=0))
        tl.store(hit_map_ptr + e, tl.where(hit, slot_of, -1), mask=e_ok)
        tl.store(load_map_ptr + e, tl.where(load, new_s_of_e, -1), mask=e_ok)
        w = tl.arange(0, BLOCK_W)
        in_wave = streamed[None, :] & ((stream_rank // ROWS)[None, :] == w[:, None])  # [W, E]
        row = tl.where(in_wave, (stream_rank % ROWS)[None, :], -1)
        tl.store(wave_map_ptr + w[:, None] * N + e[None, :], row, mask=(w[:, None] < WAVES) & e_ok[None, :])
    m64 = n_miss.to(tl.int64)
    _bump(count_ptr, 0, 1)  # COUNT_FIELDS: steps, hits, misses, evictions, loads, bytes_h2d
    _bump(count_ptr, 1, (n_need - n_miss).to(tl.int64))
    _bump(count_ptr, 2, m64)
    _bump(count_ptr, 3, n_evict.to(tl.int64))
    _bump(count_ptr, 4, m64)
    _bump(count_ptr, 5, m64 * expert_bytes)


@triton.jit
def _copy_misses(src_ptr, dst_ptr, miss_e_ptr, miss_s_ptr, n_miss_ptr, first, per_expert,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    if first + i < tl.load(n_miss_ptr):
        src = src_ptr + tl.load(miss_e_ptr + first + i).to(tl.int64) * per_expert
        dst = dst_ptr + tl.load(miss_s_ptr + i).to(tl.int64) * per_expert
        for off in range(0, CHUNK, BLOCK):
            idx = c.to(tl.int64) * CHUNK + off + tl.arange(0, BLOCK)
            ok = idx < per_expert
            tl.store(dst + idx, tl.load(src + idx, mask=ok), mask=ok)


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous [S, ...] tensor seen as [S, W] of the widest word that divides a row (copy unit)."""
    row = t[0].numel() * t.element_size()
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        if row % dtype.itemsize == 0:
            return t.reshape(t.shape[0], -1).view(dtype)
    raise AssertionError("unreachable")


class DeviceLRU:
    """The device-side state and launches for one pager (see the module docstring)."""

    COPY_CHUNK_BYTES = 256 * 1024
    STAGED_COPY_PROGRAMS = 256  # a wave's copy is cut into about this many programs per tensor

    def __init__(self, num_experts: int, capacity: int, expert_bytes: int, device: torch.device):
        self.num_experts, self.capacity, self.expert_bytes = num_experts, capacity, expert_bytes
        self.expert_in_slot = torch.full((capacity,), -1, dtype=torch.int32, device=device)
        self.last_used = torch.full((capacity,), -1, dtype=torch.int64, device=device)
        self.touch_count = torch.zeros((1,), dtype=torch.int64, device=device)
        self.miss = torch.zeros((2, capacity), dtype=torch.int32, device=device)
        self.n_miss = torch.zeros((1,), dtype=torch.int32, device=device)
        self.counts = torch.zeros((len(COUNT_FIELDS),), dtype=torch.int64, device=device)
        self.wide: WideDecision | None = None  # a wide step's outputs, made on the first one

    def prepare(self, expert_map: torch.Tensor, topk_ids: torch.Tensor, host: dict[str, torch.Tensor],
                scratch: dict[str, torch.Tensor]) -> None:
        """Launch the decision and the copies for one group's routed ids [T, K] (no host sync)."""
        self._decide(expert_map, topk_ids, None)
        self.copy_loads(host, scratch, min(topk_ids.numel(), self.capacity))

    def decide_wide(self, expert_map: torch.Tensor, topk_ids: torch.Tensor, rows: int) -> "WideDecision":
        """Launch a wide step's decision for routed ids [T, K] (any number of distinct experts; no host sync):
        the state moves exactly as `ExpertPager.decide`'s, and the returned `WideDecision` says what to copy
        and through which maps to compute. Nothing is copied here (`copy_loads`, `copy_wave`)."""
        if self.wide is None or self.wide.rows != rows:  # sized for any step: its tensors keep their addresses
            self.wide = WideDecision(self.num_experts, rows, expert_map.device)
        wide = self.wide
        wide.waves = wide.waves_for(topk_ids.numel(), min(self.capacity, self.num_experts))
        self._decide(expert_map, topk_ids, wide)
        return wide

    def _decide(self, expert_map: torch.Tensor, topk_ids: torch.Tensor, wide: "WideDecision | None") -> None:
        ids = topk_ids.reshape(-1)
        n_pairs = ids.numel()
        if topk_ids.shape[-1] > self.capacity:
            raise ValueError(f"top-k {topk_ids.shape[-1]} exceeds the scratch's {self.capacity} slots")
        out = (wide.stream_e, wide.n_stream, wide.hit_map, wide.load_map, wide.wave_map, wide.rows,
               wide.waves) if wide is not None else (self.n_miss,) * 5 + (1, 1)
        _lru_decide[(1,)](
            ids, n_pairs, topk_ids.shape[-1], expert_map, self.expert_in_slot, self.last_used, self.touch_count,
            self.miss[0], self.miss[1], self.n_miss,
            self.counts, self.num_experts, self.capacity, self.expert_bytes, *out,
            BLOCK_P=triton.next_power_of_2(max(n_pairs, 2)), BLOCK_E=triton.next_power_of_2(max(self.num_experts, 2)),
            BLOCK_C=triton.next_power_of_2(max(self.capacity, 2)),
            BLOCK_W=triton.next_power_of_2(max(out[-1], 2)), WIDE=wide is not None,
        )

    def copy_loads(self, host: dict[str, torch.Tensor], scratch: dict[str, torch.Tensor], max_loads: int) -> None:
        """Copy the last decision's loads (at most `max_loads`) from the host masters into their slots."""
        _copy_listed(host, scratch, self.miss[0], self.miss[1], self.n_miss, 0, max_loads,
                     self.COPY_CHUNK_BYTES)

    def copy_wave(self, host: dict[str, torch.Tensor], staging: dict[str, torch.Tensor], wide: "WideDecision",
                  wave: int) -> None:
        """Copy a wide step's streamed misses of one wave (ranks wave x rows on) into staging rows 0, 1, ..."""
        per_tensor = max(t[0].numel() * t.element_size() for t in host.values())
        chunk = max(per_tensor * wide.rows // self.STAGED_COPY_PROGRAMS, 32 * 1024)
        _copy_listed(host, staging, wide.stream_e, wide.row_of_program, wide.n_stream, wave * wide.rows, wide.rows,
                     min(chunk, self.COPY_CHUNK_BYTES))


class WideDecision:
    """A wide step's decision on the device (`DeviceLRU.decide_wide` rewrites it in place, so graphs captured
    over it stay valid): `hit_map` [N] the hits' slots before the step, `load_map` [N] the kept misses' new
    slots, `stream_e` the other misses in ascending id (`n_stream` of them), and per wave of `rows` of them
    `wave_map[w]` [N] -> staging row (-1 elsewhere); `waves` is how many the last step may have used."""

    def __init__(self, num_experts: int, rows: int, device: torch.device):
        self.rows, self.num_experts = rows, num_experts
        most = self.waves_for(num_experts, 0)
        self.stream_e = torch.zeros((num_experts,), dtype=torch.int32, device=device)
        self.n_stream = torch.zeros((1,), dtype=torch.int32, device=device)
        self.hit_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
        self.load_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
        self.wave_map = torch.full((most, num_experts), -1, dtype=torch.int32, device=device)  # [W, N]
        self.row_of_program = torch.arange(rows, dtype=torch.int32, device=device)
        self.waves = most

    def waves_for(self, n_pairs: int, kept: int) -> int:
        """Waves enough for a step of `n_pairs` routed pairs when `kept` of its experts stay in slots."""
        return max(-(-max(min(n_pairs, self.num_experts) - kept, 0) // self.rows), 1)


def _copy_listed(host: dict[str, torch.Tensor], dest: dict[str, torch.Tensor], experts: torch.Tensor,
                 rows: torch.Tensor, count: torch.Tensor, first: int, programs: int, chunk_bytes: int) -> None:
    """dest[rows[i]] = host[experts[first + i]] for i < min(programs, count - first), every tensor of the bank,
    read from the pinned masters in place (UVA); programs past the count exit at once (no host sync)."""
    for name, master in host.items():
        src, dst = _words(master), _words(dest[name])
        per = src.shape[1]
        chunk = max(chunk_bytes // src.element_size(), 1024)
        _copy_misses[(programs, triton.cdiv(per, chunk))](
            device_view(src, dst.device), dst, experts, rows, count, first, per, CHUNK=chunk, BLOCK=1024
        )
