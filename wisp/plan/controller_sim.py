"""The online controller replayed over a request stream, against static splits and a per-workflow oracle.

The stream is a list of `SimRequest`s in arrival order, each holding the stack distances of its expert
references (all MoE layers, `wisp.plan.miss_curves.stack_distances` over the whole stream) and of its KV
blocks (`kv_stack_distances`), and the workflow it belongs to. Under LRU a reference misses at a split iff
its distance exceeds that side's size (or it is COLD), so a request's cost at any split is exact:

    seconds = expert_miss_seconds * #{expert d > expert_cap} + kv_miss_seconds * #{kv d > kv_blocks}.

Arms (`simulate_controller`):
- "static:<cap>": every feasible fixed split; the best of them is "best-static";
- "oracle": each workflow served at the split best for that workflow alone (it knows the future);
- "controller": a `SplitController` that sees each request's distances after serving it and may resize
  between requests.

Approximation, stated: after the controller GROWS a side, the new room starts empty, while the distances
assume it had held the most recent items all along; shrinking is exact (LRU drops the least recent).
So the controller's figure is a lower bound on its real cost, tight when resizes are rare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wisp.plan.controller import ControllerConfig, SplitController
from wisp.plan.miss_curves import COLD
from wisp.plan.split import SplitProblem


@dataclass(frozen=True)
class SimRequest:
    workflow: str
    tokens: int  # tokens the request computes (prefill + decode): its share of the expert stream
    expert_distances: np.ndarray  # int64, COLD for a first reference
    kv_distances: np.ndarray


@dataclass(frozen=True)
class SimResult:
    arm: str
    seconds: float  # predicted miss seconds over the whole stream
    resizes: int


def misses(distances: np.ndarray, size: int) -> int:
    d = np.asarray(distances)
    return int(np.count_nonzero((d == COLD) | (d > size)))


def request_seconds(p: SplitProblem, r: SimRequest, expert_cap: int, kv_blocks: int, expert_miss_seconds: float) -> float:
    return expert_miss_seconds * misses(r.expert_distances, expert_cap) + p.kv_cost * misses(r.kv_distances, kv_blocks)


def stream_seconds(p: SplitProblem, requests: Sequence[SimRequest], cap: int, expert_miss_seconds: float) -> float:
    return sum(request_seconds(p, r, cap, p.kv_blocks(cap), expert_miss_seconds) for r in requests)


def simulate_controller(config: ControllerConfig, requests: Sequence[SimRequest], expert_miss_seconds: float,
                        start_cap: int | None = None) -> list[SimResult]:
    """Every static split, the best of them, the per-workflow oracle and the controller (module docstring).
    `config.problem.kv_cost` is one KV block miss's seconds; expert misses cost `expert_miss_seconds` each."""
    p = config.problem
    caps = list(p.feasible_caps())
    static = {c: stream_seconds(p, requests, c, expert_miss_seconds) for c in caps}
    best_cap = min(caps, key=lambda c: (static[c], -c))
    results = [SimResult(f"static:{c}", s, 0) for c, s in static.items()]
    results.append(SimResult("best-static", static[best_cap], 0))
    results.append(SimResult("oracle", _oracle_seconds(p, requests, caps, expert_miss_seconds), 0))
    results.append(_controller_result(config, requests, expert_miss_seconds, start_cap or best_cap))
    return results


def _oracle_seconds(p: SplitProblem, requests: Sequence[SimRequest], caps: list[int], expert_miss_seconds: float) -> float:
    total = 0.0
    for workflow in dict.fromkeys(r.workflow for r in requests):
        mine = [r for r in requests if r.workflow == workflow]
        total += min(stream_seconds(p, mine, c, expert_miss_seconds) for c in caps)
    return total


def _controller_result(config: ControllerConfig, requests: Sequence[SimRequest], expert_miss_seconds: float,
                       start_cap: int) -> SimResult:
    p = config.problem
    ctl = SplitController(config, start_cap, p.kv_blocks(start_cap))
    seconds = 0.0
    for r in requests:
        seconds += request_seconds(p, r, ctl.expert_cap, ctl.kv_blocks, expert_miss_seconds)
        ctl.observe_experts(r.expert_distances.tolist(), r.tokens)
        ctl.observe_kv(r.kv_distances.tolist())
        ctl.step()
    return SimResult("controller", seconds, len(ctl.resizes))
