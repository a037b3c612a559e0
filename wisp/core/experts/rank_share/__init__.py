"""The rank share: hybrid-zero-copy's CPU share of a decode step, by routing rank, inside CUDA graphs.

The eager hybrid step (`wisp.core.experts.miss_policies`' in-place-or-cpu) assigns a layer's experts by their
measured costs, so it needs the routing on the host before it can launch anything for the GPU: per layer a
host read, the assignment in Python, the launches, a write back. Here the share is fixed by rank instead: of
each token's top-k pairs, those of rank k < n (`cpu_share`, a device scalar) are the CPU's and the rest the
GPU's. Which experts those are does not matter to the GPU's work, so it can be captured
(`wisp.engine.decode.cpu_ranks`; why: docs/decisions/rank-share-by-routing-rank-inside-graphs.md). Two parts:
the captured part (`captured.RankShareCaptured`, graph-safe device work and the buffers) and the host worker
(`host_worker.RankShareWorker`, the CPU's pairs, the accounting and the choice of n); `RankShare` holds both.
- `send` (end of a piece's graph): the experts' input rows and the routing go to pinned host buffers;
- `gpu_pairs` (a graph): the GPU reads its pairs' experts in place (the CPU's ranks get a placeholder id,
  N, that the map sends nowhere) into the [T*K, D] float32 pair outputs;
- `cpu_rows` (the host, between graphs): waits for the routing, computes its pairs from the pinned
  masters with the CPU kernel (the native kernel's SiLU experts: grouping, kernels and rows in one native
  call, `wisp.core.kernels.cpu_expert_kernels.rank_share_rows`) into pinned host rows, and `account` later counts the layer and feeds the pace.
  Under the graphs the accounting waits until the next layer's graphs are launched
  (`wisp.engine.decode.cpu_ranks.PiecesWithCpuRanks.replay`), so the merge and the next layer's work are queued the
  moment the CPU's rows are, with no bookkeeping on the step's critical path
  (docs/decisions/rank-share-accounts-after-the-next-layer-is-queued.md). `serve` is `rows_to_device` (the
  rows, then `rows_in`) and `account` at once (eager callers);
- `rows_in` then `merge` (captured at the head of the next piece's graph, so one launch follows the CPU's
  rows): the rows copied to a device buffer (stream-ordered after the GPU's pairs: the host does not wait
  for them), the CPU's rows take their ranks' places, and the pairs are summed over k in routing order,
  as every mode does.
n is chosen per step from the probed costs as the pace corrects them (`cpu_share_for`): the smallest n
with the least predicted time, max(CPU's experts, GPU's in-place pairs). The pace learns each side apart:
the CPU's from its own side (`CpuPace.observe`'s `ratio`), not from the wall, which includes the wait for the
GPU's; under the graphs, the in-place reads' price from the GPU's pairs timed on the device (`link`).

Invariants:
- every (token, k) pair is computed once: by the CPU iff k < n; the sum over k runs in routing order;
- for a fixed n a pair's output depends only on its token's row and its expert (which server computes
  it depends on its rank alone, not on the batch): the step is batch invariant for a fixed n, and equal
  to the eager hybrid step that sends the same experts to the CPU (for distinct experts), bit for bit;
- counters as hybrid's eager step: each routed expert a miss, the CPU's also `cpu_computed`, bytes for
  the pairs the GPU reads in place;
- the host buffers are rewritten only after the stream has passed the copies that read them: each layer
  has its own, and `cpu_rows` waits for this layer's routing, which the stream sends only after this
  layer's rows of the step before have landed (and `send` runs after `cpu_rows` returned);
- `account` is called once per `cpu_rows`, before the step ends (the pace's step closes then), with
  events not recorded again since that layer's; with hot experts, `refresh_hot` after every layer's merge
  (the host's view of which pairs were hot is the map the step ran with).
"""

from __future__ import annotations

import torch

from wisp.core.experts.rank_share.captured import RankShareCaptured
from wisp.core.experts.rank_share.host_worker import CpuRowsDone, RankShareWorker


class RankShare:
    """One MoE layer's rank share: its captured part and its host worker, over one set of buffers."""

    def __init__(self, store, max_batch: int, top_k: int, hidden: torch.Tensor):
        """`store`: an `ExpertStore` whose `rank_share` holds (its masters, kernels, CPU server, counters);
        `hidden`: a row like the experts' input (its width, dtype and device)."""
        self.captured = RankShareCaptured(store, max_batch, top_k, hidden)
        self.worker = RankShareWorker(self.captured, hidden)

    @property
    def store(self):
        return self.captured.store

    @property
    def hot(self):
        return self.captured.hot


__all__ = ["CpuRowsDone", "RankShare", "RankShareCaptured", "RankShareWorker"]
