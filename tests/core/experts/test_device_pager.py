"""The device-side paging decision (`prepare_on_device`) against the host pager.

Two pagers over the same masters see the same routing; one decides on the host, one on the device.
After every step (and after long runs on the device alone, and under CUDA-graph replay) their maps,
last-used touch numbers, touch counts, counters and slot bytes must agree exactly; the host pager is fed `touch_order` of the
same tokens, so a group of several tokens also checks the device's recency order (last token, then id). On the GPU machine the masters are pinned and
read through UVA; elsewhere the same kernels run on CPU tensors under Triton's interpreter.
"""

from __future__ import annotations

import random

import pytest
import torch

from wisp.core.experts.pager import ExpertPager, use_host_many
from wisp.core.experts.recency import touch_order

pytest.importorskip("triton")
ON_GPU = torch.cuda.is_available()
CUDA = torch.device("cuda" if ON_GPU else "cpu")  # the name says where the state lives on the GPU machine
STEPS = 40 if ON_GPU else 8


def masters(n: int, dtype=torch.bfloat16, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # odd row sizes exercise the narrow copy words; 24*40*2 bytes rows take the int64 path
    bank = {"gate_up": torch.randn(n, 24, 40, generator=g).to(dtype), "down": torch.randn(n, 5, 3, generator=g).to(dtype)}
    return {k: v.pin_memory() for k, v in bank.items()} if ON_GPU else bank


def routing(rng: random.Random, n: int, t: int, k: int, hot: int) -> list[list[int]]:
    """t tokens of k distinct experts, mostly from a hot set so that hits and evictions both happen."""
    pool = list(range(n))
    return [rng.sample(pool[:hot] if rng.random() < 0.7 else pool, k) for _ in range(t)]


def same_state(host: ExpertPager, dev: ExpertPager) -> None:
    dev.use_host()
    assert dev.slot_of == host.slot_of
    assert dev.expert_in_slot == host.expert_in_slot
    assert dev.last_used == host.last_used and dev._touch_count == host._touch_count
    assert dev.counters == host.counters
    dev.check_integrity()


SHAPES = [(8, 2, 2, 1), (16, 4, 4, 1), (64, 16, 8, 2), (128, 16, 8, 2), (60, 13, 4, 3), (128, 128, 8, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("n,c,k,t,sync_every", [(*shape, every) for shape in SHAPES for every in (1, 7)
                                                if ON_GPU or shape[0] < 64 or (every == 1 and shape != (64, 16, 8, 2))])
# (interpreted on a CPU a wide case takes 5-12 s: there the wide shapes run once, (64, 16, 8, 2) not at all)
def test_device_decision_equals_host(n, c, k, t, sync_every):
    rng = random.Random(n * 1000 + c)
    bank = masters(n)
    host, dev = ExpertPager(bank, c, CUDA), ExpertPager(bank, c, CUDA)
    for step in range(STEPS):
        ids = routing(rng, n, t, k, hot=max(k, c // 2 + 1))
        host.prepare(touch_order(ids))
        dev.prepare_on_device(torch.tensor(ids, device=CUDA))
        if step % sync_every == 0:
            same_state(host, dev)
    same_state(host, dev)
    host.check_integrity()


@pytest.mark.slow
def test_many_layers_hand_their_state_back_in_one_read():
    """`use_host_many` over layers of different sizes (and one still on the host) == each layer's host mirror."""
    rng = random.Random(5)
    layers = [(8, 2, 2), (16, 5, 4), (12, 12, 3)]
    pairs = [(ExpertPager(masters(n, seed=i), c, CUDA), ExpertPager(masters(n, seed=i), c, CUDA))
             for i, (n, c, _) in enumerate(layers)]
    for _ in range(4):
        for (n, c, k), (host, dev) in zip(layers, pairs):
            ids = routing(rng, n, 1, k, hot=k + 1)
            host.prepare(touch_order(ids))
            dev.prepare_on_device(torch.tensor(ids, device=CUDA))
    pairs[2][1].use_host()  # already on the host: left as it is
    use_host_many([dev for _, dev in pairs])
    for host, dev in pairs:
        assert dev.state_on == "host"
        assert (dev.slot_of, dev.expert_in_slot, dev.last_used, dev._touch_count) == (host.slot_of, host.expert_in_slot, host.last_used, host._touch_count)
        assert dev.counters == host.counters and int(dev.device_lru.counts.abs().sum()) == 0
        dev.check_integrity()


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need the GPU machine")
def test_device_decision_under_cuda_graph_replay():
    n, c, k = 32, 8, 4
    rng = random.Random(3)
    bank = masters(n)
    host, dev = ExpertPager(bank, c, CUDA), ExpertPager(bank, c, CUDA)
    ids = torch.zeros((2, k), dtype=torch.int64, device=CUDA)
    dev.use_device()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dev.prepare_on_device(ids)  # warm-up (compiles); mirrored on the host pager below
    torch.cuda.current_stream().wait_stream(stream)
    host.prepare([0])  # the warm-up routed every pair to expert 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dev.prepare_on_device(ids)
    for _ in range(30):
        rows = routing(rng, n, 2, k, hot=6)
        ids.copy_(torch.tensor(rows))
        graph.replay()
        host.prepare(touch_order(rows))
    torch.cuda.synchronize()
    same_state(host, dev)


@pytest.mark.slow
def test_state_survives_moving_between_host_and_device():
    n, c, k = 16, 4, 2
    rng = random.Random(5)
    bank = masters(n)
    host, mixed = ExpertPager(bank, c, CUDA), ExpertPager(bank, c, CUDA)
    for step in range(STEPS):
        ids = routing(rng, n, 2, k, hot=3)
        need = touch_order(ids)
        host.prepare(need)
        if step % 3 == 0:
            mixed.prepare(need)  # takes the state back to the host
        else:
            mixed.prepare_on_device(torch.tensor(ids, device=CUDA))
    same_state(host, mixed)
