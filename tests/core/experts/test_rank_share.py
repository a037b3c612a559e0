"""RankShare: the CPU's share of a no-slot hybrid step by routing rank. Run eagerly here (the graphs are
tests/engine/decode/test_graphs.py's): it equals the eager hybrid step that sends the same experts to the CPU,
bit for bit; it is batch invariant for a fixed share; its counters and choice of share add up."""

from __future__ import annotations

import time

import pytest
import torch

from tests.core.experts.test_experts import make
from tests.core.experts.test_hybrid_experts import CPU_CHEAP, hold, zero_copy_pair
from wisp.core.kernels.expert_extras import Activation
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.experts.cpu_assignment import CpuAssignment
from wisp.core.experts.rank_share import RankShare


def share_step(share: RankShare, hidden, ids, weights, n: int) -> torch.Tensor:
    """One layer of a rank-share step as the graphs run it, eagerly."""
    share.worker.set_share(n)
    share.captured.send(hidden, ids)
    events = [torch.cuda.current_stream().record_event() for _ in range(2)] if hidden.is_cuda else [None, None]
    per_k = share.captured.gpu_pairs(hidden, ids)
    share.worker.serve(hidden.shape[0], *events)
    out = share.captured.merge(per_k, ids, weights, hidden.dtype)
    share.worker.refresh_hot()  # after the merge, as `PiecesWithCpuRanks.replay` does after the step's last layer
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [0, 1, 3, 4])
def test_a_rank_share_step_equals_the_eager_step_with_the_same_experts_on_the_cpu(device, dtype, n):
    host, _, _, _ = make(16, 1, 4, 31, dtype)
    hybrid, _ = zero_copy_pair(device, host, CPU_CHEAP)
    eager, _ = zero_copy_pair(device, host, CPU_CHEAP)
    share = RankShare(hybrid, 4, 4, torch.zeros((1, host["down"].shape[1]), dtype=dtype, device=device))
    for step in range(4):
        hidden, ids, weights = (x.to(device) for x in make(16, 1, 4, 700 + step, dtype)[1:])
        row = ids[0].tolist()
        eager.cpu.assign = lambda misses, row=row: CpuAssignment(tuple(row[n:]), tuple(row[:n]), 0.0, (1,) * n)
        out = share_step(share, hidden, ids, weights, n)
        ref = eager.forward(hidden, ids, weights)
        assert torch.equal(out, ref), (n, step)
    c = hybrid.counters
    assert (c.steps, c.misses, c.cpu_computed) == (4, 16, 4 * n)
    assert eager.counters.cpu_computed == 4 * n  # the eager step did send those experts to the CPU
    assert c.bytes_h2d == 4 * (4 - n) * hybrid.expert_bytes  # the GPU reads its pairs in place
    assert hybrid.cpu.pace.totals.steps == (4 if n else 0)  # a layer with CPU pairs is paced


def test_a_token_gets_the_same_bits_alone_and_in_a_batch(device):
    """For a fixed share, which server computes a pair depends on its rank alone: batch invariant."""
    host, hidden, ids, weights = make(8, 3, 4, 41, torch.bfloat16)
    hybrid, _ = zero_copy_pair(device, host, CPU_CHEAP)
    share = RankShare(hybrid, 4, 4, hidden.to(device))
    hidden, ids, weights = hidden.to(device), ids.to(device), weights.to(device)
    batch = share_step(share, hidden, ids, weights, 2).clone()
    for t in range(3):
        alone = share_step(share, hidden[t : t + 1], ids[t : t + 1], weights[t : t + 1], 2)
        assert torch.equal(alone[0], batch[t]), t


class SlowEvent:
    """An event whose wait takes `seconds` (the host's side of serve sees only `synchronize`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def synchronize(self) -> None:
        time.sleep(self.seconds)


def test_the_hosts_waits_are_recorded_where_they_happen():
    host, hidden, ids, _ = make(8, 1, 4, 11, torch.float32)
    hybrid, _ = zero_copy_pair("cpu", host, CPU_CHEAP)
    share = RankShare(hybrid, 1, 4, hidden)
    share.worker.set_share(2)
    share.captured.send(hidden, ids)
    share.worker.serve(1, SlowEvent(0.02), SlowEvent(0.04))
    t = hybrid.cpu.pace.totals
    assert t.steps == 1 and 0.02 <= t.routing_wait_s < 0.04 <= t.gpu_wait_s
    assert t.wall_s == pytest.approx(t.kernel_s + t.gpu_wait_s)  # the routing wait is before the wall starts
    cpu_s, cpu_predicted = hybrid.cpu.pace._open  # the pace's ratio: the CPU side alone, at the probe's costs
    assert cpu_s < 0.04 and cpu_predicted == pytest.approx(CPU_CHEAP.cpu_overhead_s + 2 * CPU_CHEAP.cpu_s(1))


class DeviceTimedEvent(SlowEvent):
    """An event pair whose device time between them is `ms` (as CUDA events with timing report it)."""

    def __init__(self, ms: float):
        super().__init__(0.0)
        self.ms = ms

    def elapsed_time(self, end) -> float:
        return self.ms


def test_timed_events_give_the_pace_the_gpu_pairs_against_their_copy_price():
    host, hidden, ids, _ = make(8, 1, 4, 13, torch.float32)
    hybrid, _ = zero_copy_pair("cpu", host, CPU_CHEAP)
    share = RankShare(hybrid, 1, 4, hidden)
    share.worker.set_share(1)  # 1 rank on the CPU, 3 read in place
    share.captured.send(hidden, ids)
    pace = hybrid.cpu.pace
    share.worker.serve(1, DeviceTimedEvent(4500.0), DeviceTimedEvent(0.0), timed=True)  # ms: the events' unit
    pace.end_step()
    assert list(pace.link_ratios) == pytest.approx([4.5 / (3 * CPU_CHEAP.copy_s)])  # 1.5 x the copy price
    assert pace.totals.gpu_s == pytest.approx(4.5) and pace.totals.cpu_ranks == 1
    share.worker.set_share(4)
    share.worker.serve(1, DeviceTimedEvent(4500.0), DeviceTimedEvent(0.0), timed=True)  # no GPU pairs: no link ratio
    pace.end_step()
    assert len(pace.link_ratios) == 1 and pace.totals.gpu_s == pytest.approx(4.5) and pace.totals.cpu_ranks == 5


def test_a_layer_is_counted_and_paced_only_when_accounted_for_and_its_wall_is_the_later_side():
    """Under the graphs the host sends its rows and moves on; the layer's accounting comes later (after the next
    layer's graphs are queued), and with device-timed GPU pairs its wall is the later of the two sides."""
    host, hidden, ids, _ = make(8, 1, 4, 17, torch.float32)
    hybrid, _ = zero_copy_pair("cpu", host, CPU_CHEAP)
    share = RankShare(hybrid, 1, 4, hidden)
    share.worker.set_share(2)
    share.captured.send(hidden, ids)
    done = share.worker.rows_to_device(1, SlowEvent(0.01))
    c, t = hybrid.counters, hybrid.cpu.pace.totals
    assert done.computed == len(set(ids[0, :2].tolist())) and done.routing_wait_s >= 0.01
    assert (c.steps, c.misses, t.steps) == (0, 0, 0)  # nothing counted yet
    assert torch.equal(share.captured.rows[0, :2], share.captured.rows_host[0, :2])  # the CPU's rows already sent
    share.worker.account(done, DeviceTimedEvent(3000.0), DeviceTimedEvent(0.0), timed=True)  # the GPU's side: 3 s
    assert (c.steps, c.misses, c.cpu_computed, t.steps) == (1, 4, done.computed, 1)
    assert t.kernel_s == done.cpu_s and t.gpu_wait_s == pytest.approx(3.0 - done.cpu_s)
    assert t.wall_s == pytest.approx(3.0) and t.gpu_s == pytest.approx(3.0)  # max(CPU side, GPU side)


def test_the_share_balances_the_paced_costs_and_refuses_a_bad_value(device):
    host = make(8, 1, 4, 5, torch.float32)[0]
    link_slow = HybridCosts(copy_s=3.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,))  # a pair read in place: 3 CPU experts
    hybrid, _ = zero_copy_pair(device, host, link_slow)
    share = RankShare(hybrid, 2, 4, torch.zeros((1, host["down"].shape[1]), device=device))
    assert share.worker.cpu_share_for(1) == 3  # max(3 x 1, 1 x 3) = 3 beats 2 x 3 and 4 x 1
    assert share.worker.predicted_s(1, 3) == 3.0 and share.worker.predicted_s(1, 0) == 12.0
    hybrid.cpu.costs = HybridCosts(copy_s=0.5, cpu_rows=(1,), cpu_s_at_rows=(4.0,))  # the CPU slower than the link
    assert share.worker.cpu_share_for(1) == 0
    with pytest.raises(ValueError, match="0..4"):
        share.worker.set_share(5)


def bank_in(fmt: str, host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A bf16 bank's experts quantized to `fmt` (weights and their scale banks), or the bank as it is."""
    if fmt == "bf16":
        return host
    from tests.core.kernels.test_cpu_quantized_experts import quantize

    (gate_up, gate_up_scale), (down, down_scale) = quantize(fmt, host["gate_up"]), quantize(fmt, host["down"])
    return {"gate_up": gate_up, "down": down, "gate_up_scale": gate_up_scale, "down_scale": down_scale}


@pytest.mark.parametrize("gpt_oss", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4", "q8_0"])
def test_the_native_host_side_equals_the_kernel_path_bit_for_bit(fmt, gpt_oss):
    """With the native kernel (bf16, or quantized read packed beside their scale banks; SiLU experts, or GPT-OSS's
    with biases and the clamped SwiGLU) the host's side is one native call (`rank_share_rows`): the same rows, bit
    for bit, and the same counters as grouping the pairs in Python and calling the kernel on each expert's views."""
    from tests.core.experts.stores import hybrid_zero_copy_store, StagingBuffers

    g = torch.Generator().manual_seed(51)
    d, i = 32, 32  # the native kernel reads multiples of 16 (MXFP4 and Q8_0 rows: of 32)
    host = bank_in(fmt, {"gate_up": torch.randn((8, 2 * i, d), generator=g).bfloat16(),
                         "down": torch.randn((8, d, i), generator=g).bfloat16()})
    if gpt_oss:
        host |= {"gate_up_bias": torch.randn((8, 2 * i), generator=g).bfloat16(),
                 "down_bias": torch.randn((8, d), generator=g).bfloat16()}
    hidden = (torch.randn((3, d), generator=g) * 4).bfloat16()  # gates past the clamp's limit too
    ids = torch.tensor([[5, 1, 7, 2], [1, 5, 0, 3], [6, 1, 5, 4]])  # experts shared across tokens and ranks
    stores = [hybrid_zero_copy_store(bank, torch.device("cpu"), CPU_CHEAP, StagingBuffers(bank, torch.device("cpu")),
                                    cpu_kernel="native") for bank in (host, host)]
    if gpt_oss:
        for store in stores:
            store.kernels = store.kernels.with_activation(Activation("clamped_swiglu"))
    native, python = (RankShare(store, 3, 4, hidden) for store in stores)
    assert native.worker._native
    python.worker._native = False
    for n in (1, 2, 3):
        for share in (native, python):
            share.worker.set_share(n)
            share.captured.rows_host.fill_(float("nan"))
            share.captured.send(hidden, ids)
            share.worker.serve(3, None, None)
        cpu = (torch.arange(4) < n).expand(3, 4)  # the CPU's ranks: the only rows written
        assert torch.equal(native.captured.rows_host[cpu], python.captured.rows_host[cpu]), n
        assert native.captured.rows_host[~cpu].isnan().all()
    a, b = (store.counters for store in stores)
    assert (a.steps, a.misses, a.cpu_computed) == (b.steps, b.misses, b.cpu_computed) == (3, 3 * 8, 3 + 3 + 5)


def share_step_against_eager(share: RankShare, eager, row: list[int], hot: set[int], n: int, weights, seed: int,
                             device) -> tuple[int, ...]:
    """One rank-share step of routing `row` against the eager step that sends its non-hot experts of ranks < n to the
    CPU: equal bit for bit. Returns those experts."""
    hidden = make(16, 1, 4, seed, torch.bfloat16)[1].to(device)
    ids, weights = torch.tensor([row], device=device), weights.to(device)
    to_cpu = tuple(sorted(e for e in row[:n] if e not in hot))
    to_gpu = tuple(sorted(e for e in row if e not in to_cpu))
    eager.cpu.assign = lambda misses: CpuAssignment(to_gpu, to_cpu, 0.0, (1,) * len(to_cpu))
    assert torch.equal(share_step(share, hidden, ids, weights, n), eager.forward(hidden, ids, weights)), (n, row, hot)
    return to_cpu


HOT = [3, 7, 11]
HOT_ROUTING = [[3, 5, 7, 9], [1, 11, 2, 3], [0, 2, 7, 11], [3, 7, 11, 4], [8, 9, 10, 12]]  # hot ones at every rank


@pytest.mark.parametrize("n", [0, 2, 4])
def test_hot_experts_pairs_come_from_the_bank_and_the_cpu_gets_only_the_others(device, n):
    """The hot experts' pairs are the GPU's from its bank whatever their rank: the step equals the eager step
    that sends the other experts of ranks < n to the CPU, bit for bit; they count as hits and cost no bytes."""
    host, _, _, weights = make(16, 1, 4, 31, torch.bfloat16)
    hybrid, _ = zero_copy_pair(device, host, CPU_CHEAP)
    eager, _ = zero_copy_pair(device, host, CPU_CHEAP)
    hold(hybrid, HOT)
    share = RankShare(hybrid, 4, 4, torch.zeros((1, host["down"].shape[1]), dtype=torch.bfloat16, device=device))
    hits = misses = cpu = gpu_pairs = 0
    for step, row in enumerate(HOT_ROUTING):
        to_cpu = share_step_against_eager(share, eager, row, set(HOT), n, weights, 700 + step, device)
        hits += sum(e in HOT for e in row)
        misses += sum(e not in HOT for e in row)
        cpu += len(to_cpu)
        gpu_pairs += sum(e not in HOT for e in row[n:])
    c = hybrid.counters
    assert (c.steps, c.hits, c.misses, c.cpu_computed) == (len(HOT_ROUTING), hits, misses, cpu)
    assert c.bytes_h2d == gpu_pairs * hybrid.expert_bytes
    assert hybrid.hot.held == set(HOT) and hybrid.hot.steps == len(HOT_ROUTING)  # refreshed at step 4: kept
    assert all(live < 1.0 for live in share.worker.live)  # the prediction knows some pairs of every rank are hot


@pytest.mark.parametrize("n", [1, 3])
def test_a_refresh_between_steps_changes_which_pairs_the_cpu_skips_from_the_next_step_on(device, n, monkeypatch):
    """Hot experts chosen by the routing itself (refreshed after steps 1 and 4): each step is the eager step with
    the set as it stood when the step began, and the counters take each copy into the bank as a load. (Four
    one-token steps can never make a lead significant: the swap rule here asks only that a lead pay its copy.)"""
    monkeypatch.setattr("wisp.core.experts.hot_experts.SWAP_Z", 0.0)
    host, _, _, weights = make(16, 1, 4, 33, torch.bfloat16)
    hybrid, _ = zero_copy_pair(device, host, CPU_CHEAP)
    eager, _ = zero_copy_pair(device, host, CPU_CHEAP)
    hybrid.hold_hot(2)
    share = RankShare(hybrid, 4, 4, torch.zeros((1, host["down"].shape[1]), dtype=torch.bfloat16, device=device))
    sets = []
    for step, row in enumerate(HOT_ROUTING):
        held = set(hybrid.hot.held)
        sets.append(held)
        share_step_against_eager(share, eager, row, held, n, weights, 800 + step, device)
    assert sets[0] == set() and sets[1] == {3, 5} and sets[1] != sets[-1]  # chosen after step 1, changed after 4
    assert hybrid.counters.loads == hybrid.hot.copies >= 3


def test_the_prediction_scales_both_sides_by_the_pairs_that_are_not_hot():
    host = make(8, 1, 4, 5, torch.float32)[0]
    hybrid, _ = zero_copy_pair("cpu", host, HybridCosts(copy_s=3.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,)))
    hold(hybrid, [0])
    share = RankShare(hybrid, 2, 4, torch.zeros((1, host["down"].shape[1])))
    assert share.worker.predicted_s(1, 3) == 3.0
    share.worker.live = [0.0, 0.5, 1.0, 1.0]  # hot experts are mostly the first ranks
    assert share.worker.predicted_s(1, 2) == 6.0 and share.worker.predicted_s(1, 0) == 7.5  # max(0.5 x 1, 2 x 3), 2.5 x 3
    assert share.worker.cpu_share_for(1) == 4  # 2.5 CPU experts against nothing read in place


def test_the_native_host_side_skips_the_hot_experts_as_the_kernel_path_does():
    from tests.core.experts.stores import StagingBuffers, hybrid_zero_copy_store

    g = torch.Generator().manual_seed(52)
    d, i = 32, 16
    host = {"gate_up": torch.randn((8, 2 * i, d), generator=g).bfloat16(),
            "down": torch.randn((8, d, i), generator=g).bfloat16()}
    hidden = torch.randn((3, d), generator=g).bfloat16()
    ids = torch.tensor([[5, 1, 7, 2], [1, 5, 0, 3], [6, 1, 5, 4]])
    stores = [hybrid_zero_copy_store(host, torch.device("cpu"), CPU_CHEAP, StagingBuffers(host, torch.device("cpu")),
                                    cpu_kernel="native") for _ in range(2)]
    for store in stores:
        hold(store, [1, 7])
    native, python = (RankShare(store, 3, 4, hidden) for store in stores)
    assert native.worker._native
    python.worker._native = False
    for share in (native, python):
        share.worker.set_share(3)
        share.captured.rows_host.fill_(float("nan"))
        share.captured.send(hidden, ids)
        share.worker.serve(3, None, None)
    cpu = (torch.arange(4) < 3) & ~torch.isin(ids, torch.tensor([1, 7]))  # the CPU's pairs: the only rows written
    assert torch.equal(native.captured.rows_host[cpu], python.captured.rows_host[cpu])
    assert not native.captured.rows_host[cpu].isnan().any() and native.captured.rows_host[~cpu].isnan().all()
    a, b = (store.counters for store in stores)
    assert (a.hits, a.misses, a.cpu_computed) == (b.hits, b.misses, b.cpu_computed) == (2, 6, 3)  # 5, 0 and 6 on the CPU
