"""`PiecesWithCpuRanks.set_cpu_share` without a GPU (the graphs themselves are tests/engine/decode/test_graphs.py's): one
share for every rank-share layer, chosen at the paced costs and, with hot experts, at the layers' mean share of each
rank's pairs that were not hot."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.core.experts.test_experts import make
from tests.core.experts.test_hybrid_experts import hold, zero_copy_pair
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.experts.rank_share import RankShare
from wisp.engine.decode.cpu_ranks import PiecesWithCpuRanks

LINK_SLOW = HybridCosts(copy_s=3.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,))  # a pair read in place: 3 CPU experts


def graphs_of(lives: list[list[float]] | None) -> SimpleNamespace:
    """Two rank-share layers sharing one pace; with `lives`, each holds a hot expert and has that per-rank share."""
    host = make(8, 1, 4, 5, torch.float32)[0]
    pace, shares = CpuPace(), {}
    for layer in range(2):
        store, _ = zero_copy_pair("cpu", host, LINK_SLOW)
        store.cpu.pace = pace
        if lives:
            hold(store, [0])
        shares[layer] = RankShare(store, 2, 4, torch.zeros((1, host["down"].shape[1])))
        if lives:
            shares[layer].worker.live = lives[layer]
    return SimpleNamespace(shares=shares, holds_hot=bool(lives))


def test_one_share_for_every_layer_at_the_paced_costs():
    graphs = graphs_of(None)
    assert PiecesWithCpuRanks.set_cpu_share(graphs, 1) == 3  # max(3 x 1, 1 x 3) beats 2 x 3 and 4 x 1
    assert all(share.captured._share == 3 and share.worker._predicted_s == 3.0 for share in graphs.shares.values())


def test_with_hot_experts_the_share_follows_the_layers_mean_share_of_pairs_that_were_not_hot():
    # layer 0's first ranks are all hot, layer 1's never: at their mean [0.5, 0.5, 1, 1] four CPU ranks
    # predict max(3 x 1, 0) = 3 against 3 ranks' max(2, 3) = 3: the smaller n, 3; layer 0 alone would give 4
    graphs = graphs_of([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert graphs.shares[0].worker.cpu_share_for(1) == 4
    assert PiecesWithCpuRanks.set_cpu_share(graphs, 1) == 3
    assert {share.captured._share for share in graphs.shares.values()} == {3}
