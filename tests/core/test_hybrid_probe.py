"""The hybrid cost probe gives costs the split can use: positive, and CPU times that never fall with rows."""

import torch

from tests.core.test_experts import make
from wisp.core.hybrid_probe import probe_hybrid_costs
from wisp.core.hybrid_split import split_misses


def test_probe_returns_usable_costs():
    host, _, _, _ = make(8, 1, 2, 0, torch.float32)
    costs = probe_hybrid_costs(host, "cpu", rows=(1, 4, 16), repeats=2)
    assert costs.cpu_rows == (1, 4, 16) and costs.copy_s > 0 and costs.cpu_overhead_s >= 0
    assert all(b >= a > 0 for a, b in zip(costs.cpu_s_at_rows, costs.cpu_s_at_rows[1:]))
    split = split_misses([(0, 1), (3, 16)], costs)
    assert sorted(split.to_copy + split.to_cpu) == [0, 3]
