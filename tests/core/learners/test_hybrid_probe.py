"""The hybrid cost probe gives costs the CPU assignment can use: positive, and CPU times that never fall with rows."""

import time

import torch

from tests.core.experts.test_experts import make
from wisp.core.learners import hybrid_probe
from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS
from wisp.core.learners.hybrid_probe import probe_hybrid_costs
from wisp.core.experts.cpu_assignment import assign_misses


def test_probe_returns_usable_costs():
    host, _, _, _ = make(8, 1, 2, 0, torch.float32)
    costs = probe_hybrid_costs(host, "cpu", rows=(1, 4, 16), repeats=2)
    assert costs.cpu_rows == (1, 4, 16) and costs.copy_s > 0 and costs.cpu_overhead_s >= 0
    assert all(b >= a > 0 for a, b in zip(costs.cpu_s_at_rows, costs.cpu_s_at_rows[1:]))
    assignment = assign_misses([(0, 1), (3, 16)], costs)
    assert sorted(assignment.to_copy + assignment.to_cpu) == [0, 3]


def test_a_stall_while_timing_few_rows_is_clipped_not_spread(monkeypatch):
    """The first row count's calls stall (a busy host at load): its time is capped by the next row count's,
    and the larger row counts keep their own times."""
    host, _, _, _ = make(8, 1, 2, 0, torch.float32)
    calls, plain = [], CPU_EXPERT_KERNELS["plain"]

    def stalling(x, *args):
        calls.append(x.shape[0])
        if len(calls) <= 8:  # every call of the first row count: 3 warm-ups and repeats + 2 = 5
            time.sleep(0.05)
        return plain(x, *args)

    monkeypatch.setitem(hybrid_probe.CPU_EXPERT_KERNELS, "stalling", stalling)
    costs = probe_hybrid_costs(host, "cpu", cpu_kernel="stalling", rows=(1, 4, 16), repeats=3)
    assert calls[:8] == [1] * 8 and calls[8] == 4
    assert costs.cpu_s_at_rows[0] == costs.cpu_s_at_rows[1] < 0.05 and costs.cpu_s_at_rows[2] < 0.05
