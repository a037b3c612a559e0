"""The online split controller against fixed splits on agent-session workloads (the paper's Table 5,
simulated): what `wisp sim --sessions` prints and `benchmarks/controller_sessions.py` records.

It owns one comparison. Given a `SessionSetup` (a plan's `SplitProblem`, its expert-miss seconds and
cap), a routing trace and named KV traces (workflows), `compare_workloads` runs each workflow alone and,
when there are several, all of them back to back in the order given (the drift), and prices each
workload under these arms:

- "oracle": each workflow at the fixed split best for it alone (it knows the future: the yardstick);
- "controller": a `SplitController` started at the plan's cap, resizing between requests;
- "best-static": the one fixed split best for the whole workload (it knows the future too);
- "mv-wsa": the plan's cap, decided once beforehand;
- "50-50" and "kv-blind": the caps of `wisp.sim.arms`.

Streams come from `wisp.sim.session_sim`, seconds from `wisp.sim.controller_sim` (exact LRU misses
per request; the controller's figure is a lower bound once it grows a side). The controller prices an
expert miss per token times the workload's mean tokens per request (the one figure it is given rather
than learns), so its latency model and the simulator's agree.

Invariants (tested): every cap an arm uses lies in [min_cap, max_cap] and fits the budget; all but
50-50 keep the admission floor (50-50 reports whether it does); the oracle is at most every arm that
keeps the floor, and equals best-static on a single workflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from wisp.engine.split_controller.controller import ControllerConfig, Resize
from wisp.plan.split import SplitProblem
from wisp.sim.arms import half_half_cap, kv_blind_cap
from wisp.sim.controller_sim import (SimRequest, best_cap, oracle_splits, run_controller, static_seconds,
                                      stream_seconds)
from wisp.sim.session_sim import session_requests
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace

# The controller's settings for session streams (one step = one request): re-solve every 4 requests,
# move only for a 5% predicted gain, forget at a half-life of 20,000 references, first decide after
# 2,000 expert references.
RESOLVE_EVERY, MIN_GAIN, HALF_LIFE, MIN_OBSERVATIONS = 4, 0.05, 20000.0, 2000


@dataclass(frozen=True)
class SessionSetup:
    problem: SplitProblem  # the plan's budget, sizes, bounds and floor (its expert_cost is replaced per workload)
    expert_miss_seconds: float  # one expert miss
    plan_cap: int  # the offline plan's cap: the "mv-wsa" arm and the controller's start
    max_tokens: int = 256  # tokens one request computes, at most (`session_requests`)


@dataclass(frozen=True)
class ArmResult:
    arm: str
    caps: tuple[int, ...]  # fixed arms: one; oracle: one per workflow; controller: its start, then each resize
    kv_blocks: tuple[int, ...]  # the pool beside each cap
    seconds: float  # predicted miss seconds over the workload
    ratio_to_oracle: float
    meets_floor: bool
    resizes: tuple[Resize, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WorkloadResult:
    name: str  # "os", or "os->db->webshop" for a drift
    workflows: tuple[str, ...]
    requests: int
    tokens: int
    oracle: ArmResult
    controller: ArmResult
    best_static: ArmResult
    plan: ArmResult
    half_half: ArmResult
    kv_blind: ArmResult

    @property
    def arms(self) -> tuple[ArmResult, ...]:
        return self.oracle, self.controller, self.best_static, self.plan, self.half_half, self.kv_blind

    def to_json(self) -> dict:
        return {"workload": self.name, "workflows": list(self.workflows), "requests": self.requests,
                "tokens": self.tokens, "arms": [a.to_json() for a in self.arms]}


def workflow_name(path: str | Path) -> str:
    """A session file's workflow: its stem without the source prefix and the sample suffix
    (agentinstruct_os_sample5.json -> os, agentinstruct_db_full538_clean.jsonl -> db_full538_clean)."""
    stem = Path(path).name.split(".")[0]
    stem = stem.removeprefix("agentinstruct_")
    head, _, tail = stem.rpartition("_sample")
    return head if head and tail.isdigit() else stem


def controller_config(problem: SplitProblem) -> ControllerConfig:
    return ControllerConfig(problem, RESOLVE_EVERY, MIN_GAIN, HALF_LIFE, MIN_OBSERVATIONS)


def compare_workloads(setup: SessionSetup, routing: RoutingTrace,
                      workflows: Sequence[tuple[str, KVTrace]]) -> tuple[WorkloadResult, ...]:
    """Each workflow alone, then (with several) all back to back; see the module docstring."""
    workloads = [[w] for w in workflows] + ([list(workflows)] if len(workflows) > 1 else [])
    return tuple(compare(setup, "->".join(name for name, _ in w), session_requests(routing, w, setup.max_tokens))
                 for w in workloads)


def compare(setup: SessionSetup, name: str, requests: Sequence[SimRequest]) -> WorkloadResult:
    """Every arm on one request stream."""
    tokens = sum(r.tokens for r in requests)
    p = replace(setup.problem, expert_cost=setup.expert_miss_seconds * tokens / max(len(requests), 1))
    ems = setup.expert_miss_seconds
    static = static_seconds(p, requests, ems)
    oracle = oracle_splits(p, requests, ems)
    oracle_seconds = sum(w.seconds for w in oracle)
    ctl = run_controller(controller_config(p), requests, ems, setup.plan_cap)

    def arm(label: str, caps: Sequence[int], seconds: float, resizes: tuple[Resize, ...] = ()) -> ArmResult:
        blocks = tuple(p.kv_blocks(c) for c in caps)
        ratio = seconds / oracle_seconds if oracle_seconds else (1.0 if seconds == 0 else math.inf)
        return ArmResult(label, tuple(caps), blocks, seconds, ratio, min(blocks) >= p.kv_floor, resizes)

    def fixed(label: str, cap: int) -> ArmResult:
        return arm(label, [cap], static[cap] if cap in static else stream_seconds(p, requests, cap, ems))

    return WorkloadResult(
        name, tuple(w.workflow for w in oracle), len(requests), tokens,
        oracle=arm("oracle", [w.expert_cap for w in oracle], oracle_seconds),
        controller=arm("controller", [ctl.start_cap, *(r.to_cap for r in ctl.resizes)], ctl.seconds, ctl.resizes),
        best_static=fixed("best-static", best_cap(static)),
        plan=fixed("mv-wsa", setup.plan_cap),
        half_half=fixed("50-50", half_half_cap(p)),
        kv_blind=fixed("kv-blind", kv_blind_cap(p)),
    )
