"""Hybrid mode's store: misses assigned to copies or the CPU; on the CPU it is torch.equal to resident
(the same kernel computes every pair), on a GPU close to it; its counters add up, and with a free link it IS
paged mode. Run with --wisp-device cuda on the GPU machine (the device's side stream and copies)."""

from __future__ import annotations

import time

import pytest
import torch

from tests.core.experts.test_experts import make
from tests.core.experts.stores import paged_store, resident_store, zero_copy_store
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.expert_major import StagingBuffers
from wisp.core.kernels.cpu_expert_kernels import plain_expert_mlp
from tests.core.experts.stores import hybrid_store, hybrid_zero_copy_store
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.kernels.moe import expert_mlp
from wisp.core.learners.hybrid_costs import HybridCosts

CPU_CHEAP = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))  # the CPU serves light experts
LINK_FREE = HybridCosts(copy_s=0.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,))  # every miss copied: paged mode

STEPS = [40, 1, 1, 3, 1, 23, 1, 2, 1]  # prefill-like and decode-like batches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k, cap", [(8, 2, 2), (16, 4, 6), (16, 4, 16)])
def test_hybrid_equals_resident_on_the_cpu_and_its_counters_add_up(device, dtype, n, k, cap):
    dev = torch.device(device)
    host, _, _, _ = make(n, 1, k, 0, dtype)
    resident = resident_store({name: t.to(dev) for name, t in host.items()})
    hybrid = hybrid_store(host, cap, dev, CPU_CHEAP)
    served_on_cpu = 0
    for step, t in enumerate(STEPS):
        hidden, ids, weights = (x.to(dev) for x in make(n, t, k, 200 + step, dtype)[1:])
        out, ref = hybrid.forward(hidden, ids, weights), resident.forward(hidden, ids, weights)
        if dev.type == "cpu":
            assert torch.equal(out, ref), step
        else:  # the CPU's pairs are rounded by the CPU's GEMM
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        hybrid.residency.pager.check_integrity()
        assignment = hybrid.cpu.last_assignment
        assert set(assignment.to_cpu).isdisjoint(hybrid.residency.pager.resident_experts())  # CPU-served experts are not cached
        served_on_cpu += len(assignment.to_cpu)
    c = hybrid.counters
    assert served_on_cpu > 0 and c.cpu_computed == served_on_cpu
    assert c.misses == c.loads + c.cpu_computed and c.bytes_h2d == c.loads * hybrid.residency.pager.expert_bytes
    assert c.steps == len(STEPS)


def test_with_a_free_link_hybrid_makes_paged_decisions_exactly():
    n, k, cap = 16, 4, 6
    host, _, _, _ = make(n, 1, k, 3, torch.float32)
    hybrid = hybrid_store(host, cap, torch.device("cpu"), LINK_FREE)
    paged = paged_store(host, cap, "cpu")
    for step, t in enumerate(STEPS):
        _, hidden, ids, weights = make(n, t, k, 300 + step, torch.float32)
        assert torch.equal(hybrid.forward(hidden, ids, weights), paged.forward(hidden, ids, weights))
        assert hybrid.residency.pager.slot_of == paged.residency.pager.slot_of and hybrid.cpu.last_assignment.to_cpu == ()
    assert hybrid.counters.as_dict() == paged.counters.as_dict()


def test_a_wide_step_keeps_what_paged_keeps_and_streams_the_rest_of_its_copies():
    n, k, cap = 16, 4, 4
    host, hidden, ids, weights = make(n, 12, k, 5, torch.float32)
    costs = HybridCosts(copy_s=1.0, cpu_rows=(1, 2), cpu_s_at_rows=(0.5, 100.0))  # only 1-row experts suit the CPU
    hybrid = hybrid_store(host, cap, torch.device("cpu"), costs)
    out = hybrid.forward(hidden, ids, weights)
    distinct = torch.unique(ids).tolist()
    rows = {e: int((ids == e).sum()) for e in distinct}
    assignment = hybrid.cpu.last_assignment
    assert len(distinct) - len(assignment.to_cpu) > cap  # still a wide step on the GPU side
    assert assignment.to_cpu and all(rows[e] == 1 for e in assignment.to_cpu)
    assert hybrid.counters.loads == len(assignment.to_copy) and len(hybrid.residency.pager.resident_experts()) == cap
    assert torch.equal(out, resident_store(host).forward(hidden, ids, weights))


def test_each_cpu_step_is_measured_and_a_cpu_measured_slow_gets_nothing_more():
    n, k, cap = 8, 2, 2
    host, _, _, _ = make(n, 1, k, 0, torch.float32)
    pace = CpuPace()
    costs = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.5, 6.4))  # at most 16x slower: useless
    hybrid = hybrid_store(host, cap, torch.device("cpu"), costs, pace=pace)
    paged = paged_store(host, cap, "cpu")
    _, hidden, ids, weights = make(n, 1, k, 1, torch.float32)
    hybrid.forward(hidden, ids, weights)
    paged.forward(hidden, ids, weights)
    hybrid.begin_step(2)  # the next step begins: the first one's ratio is recorded
    assert hybrid.cpu.last_assignment.to_cpu and len(pace.ratios) == 1  # one step, one measurement
    assert pace.totals.steps == 1 and 0 < pace.totals.kernel_s <= pace.totals.wall_s
    assert pace.totals.predicted_s == hybrid.cpu.last_assignment.predicted_s
    assert not hybrid.graph_step_ok(2)
    for _ in range(pace.ratios.maxlen):
        pace.observe(100.0, 1.0)  # the CPU took far longer than predicted
        pace.end_step()
    assert hybrid.graph_step_ok(2)
    on_cpu = hybrid.counters.cpu_computed
    for step, t in enumerate(STEPS):
        _, hidden, ids, weights = make(n, t, k, 500 + step, torch.float32)
        assert torch.equal(hybrid.forward(hidden, ids, weights), paged.forward(hidden, ids, weights))
        assert hybrid.cpu.last_assignment.to_cpu == ()
    assert hybrid.counters.cpu_computed == on_cpu


def test_the_plain_cpu_kernel_is_close_to_the_reference_and_hybrid_with_it_close_to_resident():
    n, k, cap = 16, 4, 4
    host, _, _, _ = make(n, 1, k, 7, torch.float32)
    resident = resident_store(host)
    hybrid = hybrid_store(host, cap, torch.device("cpu"), CPU_CHEAP, cpu_kernel="plain")
    assert hybrid.cpu.cpu_kernel == "plain" and hybrid_store(host, cap, "cpu", CPU_CHEAP).cpu.cpu_kernel == "reference"
    for step, t in enumerate(STEPS):
        _, hidden, ids, weights = make(n, t, k, 400 + step, torch.float32)
        torch.testing.assert_close(hybrid.forward(hidden, ids, weights), resident.forward(hidden, ids, weights),
                                   rtol=1e-5, atol=1e-5)
    assert hybrid.counters.cpu_computed > 0
    x = make(n, 5, k, 9, torch.float32)[1]
    torch.testing.assert_close(plain_expert_mlp(x, host[GATE_UP][3], host[DOWN][3]),
                               expert_mlp(x, host[GATE_UP][3], host[DOWN][3]), rtol=1e-5, atol=1e-5)


def zero_copy_pair(device, host, costs):
    """A zero-copy hybrid store and a plain zero-copy one over the same masters (pinned and Triton on CUDA:
    the GPU's side reads them in place)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        host = {name: t.pin_memory() for name, t in host.items()}
    hybrid = hybrid_zero_copy_store(host, dev, costs, StagingBuffers(host, dev))
    zero_copy = zero_copy_store(host, dev, StagingBuffers(host, dev))
    if dev.type == "cuda":
        from wisp.core.kernels.registry import moe_kernels

        hybrid.kernels = zero_copy.kernels = moe_kernels("triton")
    return hybrid, zero_copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(8, 2), (16, 4)])
def test_zero_copy_hybrid_equals_zero_copy_on_the_cpu_and_its_counters_add_up(device, dtype, n, k):
    host, _, _, _ = make(n, 1, k, 11, dtype)
    hybrid, zero_copy = zero_copy_pair(device, host, CPU_CHEAP)
    on_cpu = gpu_pairs = streamed = 0
    for step, t in enumerate(STEPS):
        hidden, ids, weights = (x.to(device) for x in make(n, t, k, 600 + step, dtype)[1:])
        before = hybrid.counters.loads
        out, ref = hybrid.forward(hidden, ids, weights), zero_copy.forward(hidden, ids, weights)
        if torch.device(device).type == "cpu":
            assert torch.equal(out, ref), step
        else:  # the CPU's pairs are rounded by the CPU's GEMM
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        if hybrid.counters.loads > before:  # a prefill-like step: zero-copy's streamed step, no CPU
            streamed += hybrid.counters.loads - before
            continue
        assignment = hybrid.cpu.last_assignment
        assert sorted(assignment.to_cpu + assignment.to_copy) == sorted(set(ids.flatten().tolist()))
        on_cpu += len(assignment.to_cpu)
        gpu_pairs += sum(int((ids == e).sum()) for e in assignment.to_copy)
    c = hybrid.counters
    assert on_cpu > 0 and c.cpu_computed == on_cpu and c.misses == zero_copy.counters.misses
    assert c.bytes_h2d == (gpu_pairs + streamed) * hybrid.expert_bytes < zero_copy.counters.bytes_h2d
    assert streamed > 0 and c.steps == len(STEPS)


def hold(store, experts: list[int]) -> None:
    """Give a zero-copy hybrid store hot experts: `experts`, scored far above anything a test routes."""
    store.hold_hot(len(experts))
    store.hot.scores[experts] = 1e9
    assert store.hot.refresh() == len(experts)


def test_a_wide_step_runs_the_hot_experts_from_the_bank_and_copies_only_the_others(device):
    """A prefill chunk with hot experts held: their pairs come from the bank (hits, no bytes), every other routed
    expert is streamed once; the output is zero-copy's, bit for bit (the same kernel on the same weights)."""
    n, k = 16, 4
    host, _, _, _ = make(n, 1, k, 13, torch.bfloat16)
    hybrid, zero_copy = zero_copy_pair(device, host, CPU_CHEAP)
    hold(hybrid, [2, 9, 14])
    hidden, ids, weights = (x.to(device) for x in make(n, 40, k, 900, torch.bfloat16)[1:])
    assert torch.equal(hybrid.forward(hidden, ids, weights), zero_copy.forward(hidden, ids, weights))
    routed = set(ids.flatten().tolist())
    assert {2, 9, 14} <= routed  # 40 tokens: every hot one is routed
    c = hybrid.counters
    assert (c.hits, c.loads, c.misses) == (3, len(routed) - 3, len(routed) - 3)
    assert c.bytes_h2d == (len(routed) - 3) * hybrid.expert_bytes


def bf16_ulp(x: torch.Tensor) -> float:
    """The spacing of bfloat16 values at |x|."""
    x = x.abs().to(torch.bfloat16).cpu()
    return float(torch.nextafter(x, torch.tensor(float("inf"), dtype=torch.bfloat16)).float() - x.float())


def step_matches_zero_copy(device, hybrid, zero_copy, hidden, ids, weights) -> None:
    """One step of both stores: zero-copy's output bit for bit on the CPU; on a GPU, where the CPU's GEMM rounds
    its pairs, within two bf16 steps at the step's largest output. Not relative to each element: pairs of that
    size that cancel leave small elements whose error is still the summands' (measured on the H200 over 82 steps:
    the hybrid store at most 0.058 from the exact float64 result, zero-copy 0.021, at outputs up to 12-28)."""
    out, ref = hybrid.forward(hidden, ids, weights), zero_copy.forward(hidden, ids, weights)
    if torch.device(device).type == "cpu":
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=2 * bf16_ulp(ref.abs().max()))


@pytest.mark.parametrize("costs", [CPU_CHEAP, None])  # None: the CPU never pays (only the bank and the link)
def test_a_narrow_eager_step_runs_the_hot_experts_from_the_bank(device, costs):
    """Decode-sized eager steps with hot experts held: theirs come from the bank (hits: neither the CPU's nor
    read over the link), the split divides only the others; zero-copy's output (bit for bit on the CPU)."""
    n, k = 16, 4
    host, _, _, _ = make(n, 1, k, 19, torch.bfloat16)
    slow_cpu = HybridCosts(copy_s=1e-3, cpu_rows=(1,), cpu_s_at_rows=(1.0,))
    hybrid, zero_copy = zero_copy_pair(device, host, costs or slow_cpu)
    held = [2, 9, 14]
    hold(hybrid, held)
    hits = pairs_read = 0
    for step, t in enumerate((1, 2, 1, 3)):
        hidden, ids, weights = (x.to(device) for x in make(n, t, k, 970 + step, torch.bfloat16)[1:])
        ids[0, 0] = held[step % 3]  # a hot expert in every step
        step_matches_zero_copy(device, hybrid, zero_copy, hidden, ids, weights)
        routed = set(ids.flatten().tolist())
        hits += len(routed & set(held))
        assignment = hybrid.cpu.last_assignment
        assert sorted(assignment.to_cpu + assignment.to_copy) == sorted(routed - set(held)), step
        assert bool(assignment.to_cpu) == (costs is not None) or not (routed - set(held))
        pairs_read += sum(int((ids == e).sum()) for e in assignment.to_copy)
    c = hybrid.counters
    assert c.hits == hits > 0 and c.loads == 0 and c.bytes_h2d == pairs_read * hybrid.expert_bytes
    assert hybrid.hot.held == set(held)  # their scores stay far above: no refresh moved them


def empty_bank(device, seed: int, hot: int, tokens: int, step_seed: int):
    """A zero-copy hybrid store (16 experts, top-4) with an empty bank of `hot` experts, its zero-copy twin, and
    two steps of `tokens` tokens each."""
    n, k = 16, 4
    host, _, _, _ = make(n, 1, k, seed, torch.bfloat16)
    hybrid, zero_copy = zero_copy_pair(device, host, CPU_CHEAP)
    hybrid.hold_hot(hot)
    steps = [[x.to(device) for x in make(n, tokens, k, step_seed + i, torch.bfloat16)[1:]] for i in range(2)]
    return hybrid, zero_copy, steps


def test_a_narrow_step_that_fills_the_bank_counts_its_experts_as_loaded_misses(device):
    """The first narrow step refreshes an empty bank (its routed experts copied in for it): misses and loads, as a
    wide step counts them, not hits; the next step's held experts are hits."""
    hybrid, zero_copy, steps = empty_bank(device, 23, hot=2, tokens=2, step_seed=990)
    for hidden, ids, weights in steps:
        step_matches_zero_copy(device, hybrid, zero_copy, hidden, ids, weights)
    first, second = (set(s[1].flatten().tolist()) for s in steps)
    c = hybrid.counters
    assert c.loads == 2 and hybrid.hot.held <= first  # step 1 is due: its two most-routed copied in for it
    assert c.hits == len(second & hybrid.hot.held)
    assert c.misses == len(first) + len(second) - c.hits


def test_a_prompts_first_chunk_fills_the_hot_experts_and_its_next_chunks_copy_fewer(device):
    hybrid, zero_copy, chunks = empty_bank(device, 17, hot=3, tokens=40, step_seed=950)
    for hidden, ids, weights in chunks:
        assert torch.equal(hybrid.forward(hidden, ids, weights), zero_copy.forward(hidden, ids, weights))
    first, second = (c[1].flatten().tolist() for c in chunks)
    by_count = sorted(set(first), key=lambda e: (-first.count(e), e))
    assert hybrid.hot.held == set(by_count[:3])  # the first chunk's most-routed, held after it
    c = hybrid.counters  # the first chunk's top 3 were copied into the bank for it: loads, not hits
    assert c.hits == len(set(second) & hybrid.hot.held) > 0  # the second chunk's hits: no copies for them
    assert c.loads == c.misses == len(set(first)) + len(set(second)) - c.hits
    assert c.bytes_h2d == c.loads * hybrid.expert_bytes


def test_hot_experts_keep_decode_off_zero_copys_whole_graph_and_count_as_device_bytes():
    """A CPU that cannot help would send a decode step to zero-copy's graph, which reads every pair over the
    link; with hot experts the split step (reading them from the bank) must run instead."""
    host, _, _, _ = make(16, 1, 4, 19, torch.float32)
    slow_cpu = HybridCosts(copy_s=0.1, cpu_rows=(1,), cpu_s_at_rows=(5.0,))
    hybrid, _ = zero_copy_pair("cpu", host, slow_cpu)
    assert hybrid.graph_step_ok(4) and hybrid.device_bytes == 0
    hold(hybrid, [1, 2])
    assert not hybrid.graph_step_ok(4)
    assert hybrid.device_bytes == 2 * hybrid.expert_bytes == hybrid.hot.bytes


def test_zero_copy_hybrid_with_a_free_link_is_zero_copy_exactly():
    n, k = 16, 4
    host, _, _, _ = make(n, 1, k, 3, torch.float32)
    hybrid, zero_copy = zero_copy_pair("cpu", host, LINK_FREE)
    for step, t in enumerate(STEPS):
        _, hidden, ids, weights = make(n, t, k, 700 + step, torch.float32)
        assert torch.equal(hybrid.forward(hidden, ids, weights), zero_copy.forward(hidden, ids, weights))
    assert hybrid.counters.as_dict() == zero_copy.counters.as_dict()


def test_the_cpu_kernel_names_are_the_options_names():
    from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS
    from wisp.options import HYBRID_CPU_KERNELS

    assert tuple(CPU_EXPERT_KERNELS) == HYBRID_CPU_KERNELS


def test_an_eager_cpu_steps_ratio_is_its_cpu_side_against_the_probes_costs():
    """The split uses the scaled costs; the pace's ratio is the CPU side's time against its time at the probe's
    costs (not the split's whole time: at the split's optimum that is the copies', and the link would read as
    the CPU)."""
    host = make(8, 1, 2, 0, torch.float32)[0]
    pace = CpuPace(min_ratios=1)
    costs = HybridCosts(copy_s=0.15, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))
    hybrid = hybrid_store(host, 2, torch.device("cpu"), costs, pace=pace)
    pace.observe(2.0, 1.0)
    pace.end_step()
    assert pace.factor == 2.0  # the CPU measured 2x slower than probed
    _, hidden, ids, weights = make(8, 1, 2, 1, torch.float32)
    hybrid.forward(hidden, ids, weights)
    assignment = hybrid.cpu.last_assignment  # one copy beside one CPU expert: max(0.15, 2 x 0.1)
    assert len(assignment.to_cpu) == 1 and assignment.predicted_s == pytest.approx(0.2)
    assert pace._open[1] == pytest.approx(0.1)  # the CPU side at the probe's costs
    assert 0 < pace._open[0] <= pace.totals.wall_s


def test_the_pace_settles_at_the_cpus_real_slowness():
    """Closed loop: a CPU kernel that takes about 20 ms an expert against the probe's 5 ms; each step splits at
    the costs the pace has scaled so far. The factor settles near 4, not near its square root (ratios against
    the scaled costs), nor at the clamp (the wall against the copies' side)."""
    host = make(64, 1, 2, 0, torch.float32)[0]
    pace = CpuPace()
    costs = HybridCosts(copy_s=0.2, cpu_rows=(1, 64), cpu_s_at_rows=(0.005, 0.32))
    hybrid = hybrid_store(host, 2, torch.device("cpu"), costs, pace=pace)
    kernel = hybrid.cpu.cpu_experts.kernel

    def slow_kernel(*args, **kwargs):
        time.sleep(0.02)
        return kernel(*args, **kwargs)

    hybrid.cpu.cpu_experts.kernel = slow_kernel
    for step in range(1, 13):
        hybrid.begin_step(step)
        _, hidden, ids, weights = make(64, 1, 2, 900 + step, torch.float32)
        hybrid.forward(hidden, ids, weights)
    hybrid.begin_step(13)
    assert pace.totals.steps >= 8  # the CPU kept its expert: 4 x 5 ms is still below a 200 ms copy
    assert 3.8 <= pace.factor <= 6.0, pace.factor


def test_a_cpu_the_probe_priced_out_is_retimed_by_its_server_and_then_used():
    """Probed at an hour an expert (a stall while probing), the CPU would never get an expert, so no step would
    measure it; by step FIRST_RETIME its server re-times one expert of one row and the costs follow the real time:
    the CPU can help again."""
    from tests.core.experts.stores import hybrid_zero_copy_store
    from wisp.core.learners.hybrid_pace import FIRST_RETIME

    host = make(8, 1, 4, 61, torch.bfloat16)[0]
    stalled = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(3600.0, 3600.0))
    store = hybrid_zero_copy_store(host, torch.device("cpu"), stalled, cpu_kernel="plain")
    cpu = store.cpu
    assert not cpu.pace.cpu_can_help(cpu.costs, 8)
    for number in range(1, FIRST_RETIME + 1):
        store.begin_step(number)
    real = cpu.pace.costs(cpu.costs).cpu_s(1)
    assert 0 < real < 1.0 and cpu.pace.probe_scale < 1e-3 and cpu.pace.cpu_can_help(cpu.costs, 8)
