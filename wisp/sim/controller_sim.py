"""The online controller replayed over a request stream, against static splits and a per-workflow oracle.

The stream is a list of `SimRequest`s in arrival order, each holding the stack distances of its expert
references (all MoE layers, `wisp.plan.miss_curves.stack_distances` over the whole stream) and of its KV
blocks (`kv_stack_distances`), and the workflow it belongs to. Under LRU a reference misses at a split iff
its distance exceeds that side's size (or it is COLD), so a request's cost at any split is exact:

    seconds = expert_miss_seconds * #{expert d > expert_cap} + kv_miss_seconds * #{kv d > kv_blocks}.

Arms (`simulate_controller`; one by one: `static_seconds`, `best_cap`, `oracle_splits`, `run_controller`):
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

from wisp.engine.split_controller.controller import ControllerConfig, Resize, SplitController
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


def static_seconds(p: SplitProblem, requests: Sequence[SimRequest], expert_miss_seconds: float) -> dict[int, float]:
    """Every feasible cap (admission floor kept) -> the stream's seconds at that fixed split."""
    return {c: stream_seconds(p, requests, c, expert_miss_seconds) for c in p.feasible_caps()}


def best_cap(static: dict[int, float]) -> int:
    """The cap of the fewest seconds; ties go to the larger cap (as `wisp.plan.split.split`)."""
    return min(static, key=lambda c: (static[c], -c))


@dataclass(frozen=True)
class WorkflowSplit:
    workflow: str
    expert_cap: int  # the best fixed cap for this workflow's requests alone
    seconds: float  # their seconds at it


def oracle_splits(p: SplitProblem, requests: Sequence[SimRequest],
                  expert_miss_seconds: float) -> tuple[WorkflowSplit, ...]:
    """Per workflow, in order of first appearance, the best fixed split for its requests alone."""
    out = []
    for workflow in dict.fromkeys(r.workflow for r in requests):
        static = static_seconds(p, [r for r in requests if r.workflow == workflow], expert_miss_seconds)
        cap = best_cap(static)
        out.append(WorkflowSplit(workflow, cap, static[cap]))
    return tuple(out)


@dataclass(frozen=True)
class ControllerRun:
    start_cap: int
    seconds: float
    resizes: tuple[Resize, ...]


def run_controller(config: ControllerConfig, requests: Sequence[SimRequest], expert_miss_seconds: float,
                   start_cap: int) -> ControllerRun:
    """A `SplitController` started at `start_cap` (and the most blocks beside it), shown each request's
    distances after serving it, free to resize between requests."""
    p = config.problem
    ctl = SplitController(config, start_cap, p.kv_blocks(start_cap))
    seconds = 0.0
    for r in requests:
        seconds += request_seconds(p, r, ctl.expert_cap, ctl.kv_blocks, expert_miss_seconds)
        ctl.observe_experts(r.expert_distances.tolist(), r.tokens)
        ctl.observe_kv(r.kv_distances.tolist())
        ctl.step()
    return ControllerRun(start_cap, seconds, tuple(ctl.resizes))


def simulate_controller(config: ControllerConfig, requests: Sequence[SimRequest], expert_miss_seconds: float,
                        start_cap: int | None = None) -> list[SimResult]:
    """Every static split, the best of them, the per-workflow oracle and the controller (module docstring).
    `config.problem.kv_cost` is one KV block miss's seconds; expert misses cost `expert_miss_seconds` each."""
    p = config.problem
    static = static_seconds(p, requests, expert_miss_seconds)
    best = best_cap(static)
    results = [SimResult(f"static:{c}", s, 0) for c, s in static.items()]
    results.append(SimResult("best-static", static[best], 0))
    results.append(SimResult("oracle", sum(w.seconds for w in oracle_splits(p, requests, expert_miss_seconds)), 0))
    ctl = run_controller(config, requests, expert_miss_seconds, start_cap or best)
    results.append(SimResult("controller", ctl.seconds, len(ctl.resizes)))
    return results
