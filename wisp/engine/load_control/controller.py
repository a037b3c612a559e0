"""LoadController: which of the running requests that are ready to decode decode this step.

The scheduler asks `choose(ready, now)` every step. The answer is the decode set with the highest predicted
aggregate rate, held for a quantum, under a bound on any request's wait between two of its tokens:

- **Prediction.** A set's joint working set u per layer is the union of its members' working sets
  (`WorkingSets`; a request with no decode history yet counts as `unknown_experts` experts of its own). With C
  slots a layer, a step that routes d = min(u, b x top_k) distinct experts misses about d x (1 - C / u) of
  them when u > C (an LRU cache of C items over u items referenced at random hits C / u), and none when it
  fits (the misses of a working set's slow drift are learned into the compute: `DecodeStepCosts.observe`). Its
  seconds are `DecodeStepCosts.step_s`.
- **Rotation.** When the chosen set is not every ready request, the ready requests take turns in groups:
  with G = ceil(ready / set size) groups, a quantum lasts (max_wait - margin) / (G - 1), so each request's turn
  comes back within the bound, and a set's rate is discounted by the reload it causes at its turn (its
  working set copied in once): rate = b / step_s x quantum / (quantum + reload). Everyone decoding together is
  the alternative it must beat, at no discount.
- **Choice.** A new set is grown greedily from a seed (the set in its quantum, or at a turn the longest-waiting
  request, or the overdue ones): the request that raises the predicted rate most joins, until none does. So
  requests whose working sets overlap go together, and a request that fits with the others joins at once.
- **Fairness.** A ready request outside the set whose wait would pass the bound if it sat out one more step is
  overdue: it seeds a new choice at once, which takes in others only while the step still ends within every
  member's bound. No request starves: the longest waiter seeds every turn.

Invariants: the answer is a non-empty subset of `ready` in `ready`'s order whenever `ready` is non-empty; when the
predicted rate of everyone together is the highest (every joint set fits: C = N, or small working sets), it is
all of `ready`; an overdue request is always in it. Which requests decode never changes what they compute: a
request's tokens do not depend on its batch (the engine's batch invariance).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np

from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.engine.load_control.working_sets import WorkingSets


@dataclass(frozen=True)
class LoadControlState:
    """Where load control stands (engine stats and /metrics)."""

    decode_width: int  # requests the last step decoded
    held_back: int  # ready requests the last step held back
    joint_working_set: float  # the current set's predicted joint working set, mean experts per MoE layer
    width_steps: dict[int, int]  # steps per decode width
    switches: int  # times the decode set changed at a turn or for an overdue request
    overdue: int  # times a request reached the wait bound and was taken at once


class LoadController:
    def __init__(self, working_sets: WorkingSets, costs: DecodeStepCosts, caps: Seq[int], max_wait_s: float,
                 unknown_experts: int | None = None):
        """caps: each MoE layer's slots, in the working sets' layer order; unknown_experts: the working set
        assumed per layer for a request with no decode history (default 2 x top_k, at most the experts)."""
        self.ws, self.costs = working_sets, costs
        self.caps = np.asarray(caps, dtype=np.float64)  # [L]
        self.max_wait_s = max_wait_s
        k, n = working_sets.top_k, working_sets.num_experts
        self.unknown_experts = min(n, 2 * k) if unknown_experts is None else unknown_experts
        self.current: list[str] = []  # the decode set, in the order chosen
        self.turn_ends = math.inf  # when the current set's quantum ends
        self._ready_ids: frozenset[str] = frozenset()
        self._width_steps: Counter[int] = Counter()
        self._last = (0, 0)
        self._joint = 0.0
        self.switches = self.overdue_count = 0

    # -- the scheduler's question ---------------------------------------------------------------------
    def choose(self, ready: list, now: float) -> list:
        """The ready requests (`Sequence`s with `request_id` and `last_token_time`) that decode this step."""
        if len(ready) <= 1:
            return self._answer(ready, ready)
        ids = [s.request_id for s in ready]
        waits = {s.request_id: now - s.last_token_time for s in ready}
        overdue = self._overdue(ids, waits)
        if overdue:
            self.overdue_count += len(overdue)
            self._decide(ids, waits, now, seed=sorted(overdue, key=lambda r: -waits[r]))
        elif now >= self.turn_ends or not set(self.current) & set(ids):
            self._decide(ids, waits, now, seed=[max(ids, key=lambda r: (waits[r], -ids.index(r)))])
        elif frozenset(ids) != self._ready_ids:  # a request arrived or left: grow from the set in its quantum
            self._decide(ids, waits, now, seed=[r for r in self.current if r in waits], keep_turn=True)
        self._ready_ids = frozenset(ids)
        members = set(self.current)
        return self._answer(ready, [s for s in ready if s.request_id in members])

    def _overdue(self, ids: list[str], waits: dict[str, float]) -> list[str]:
        """Ready requests outside the set whose wait would pass the bound if they sat out this step and joined
        the next (two steps of the set with them in it)."""
        members = [r for r in self.current if r in waits]
        worst = self.costs.step_s(len(members) + 1, (len(members) + 1) * self.ws.top_k * len(self.caps))
        near = [r for r in ids if r not in members and waits[r] + 2 * worst >= self.max_wait_s]  # cheap filter
        return [r for r in near if waits[r] + 2 * self.costs.step_s(len(members) + 1, self._misses(members + [r]))
                >= self.max_wait_s]

    def observe_step(self, width: int, seconds: float) -> None:
        """A decode step of `width` rows (the current set) took `seconds`."""
        self.costs.observe(width, seconds, self._misses(self.current) if width == len(self.current) else 0.0)

    def forget(self, request_id: str) -> None:
        self.ws.forget(request_id)
        if request_id in self.current:
            self.current.remove(request_id)

    def reset_counters(self) -> None:
        self._width_steps.clear()
        self.switches = self.overdue_count = 0

    def state(self) -> LoadControlState:
        width, held = self._last
        return LoadControlState(width, held, round(self._joint, 2), dict(sorted(self._width_steps.items())),
                                self.switches, self.overdue_count)

    # -- prediction -----------------------------------------------------------------------------------
    def joint_size(self, ids: Seq[str]) -> np.ndarray:
        """[L] predicted joint working set of `ids` (unknown requests each add `unknown_experts`)."""
        unknown = sum(1 for r in ids if not self.ws.known(r))
        n = self.ws.num_experts
        return np.minimum(self.ws.joint_size(ids) + unknown * self.unknown_experts, n).astype(np.float64)

    def _misses(self, ids: Seq[str]) -> float:
        """Predicted experts a steady decode step of `ids` copies, summed over layers."""
        if not ids:
            return 0.0
        u = self.joint_size(ids)
        distinct = np.minimum(u, len(ids) * self.ws.top_k)
        return float((distinct * np.clip(1 - self.caps / np.maximum(u, 1), 0, None)).sum())

    def _step_estimate(self) -> float:
        return self.costs.step_s(max(len(self.current), 1), self._misses(self.current))

    def rate(self, ids: Seq[str], ready: int) -> float:
        """Predicted tokens per second of decoding `ids` while `ready` requests are ready (see the docstring)."""
        b = len(ids)
        step = self.costs.step_s(b, self._misses(ids))
        if b >= ready:
            return b / step
        quantum = self._quantum(b, ready, step)
        reload = float(np.minimum(self.joint_size(ids), self.caps).sum()) * self.costs.copy_s
        return b / step * quantum / (quantum + reload)

    def _quantum(self, b: int, ready: int, step: float) -> float:
        groups = -(-ready // b)
        if groups <= 1:
            return math.inf
        margin = 4 * step
        return max(self.max_wait_s - margin, step) / (groups - 1)

    # -- choosing ---------------------------------------------------------------------------------------
    def _decide(self, ids: list[str], waits: dict[str, float], now: float, seed: list[str], keep_turn: bool = False):
        chosen = list(seed) or [ids[0]]
        best = self.rate(chosen, len(ids))
        rest = sorted((r for r in ids if r not in chosen), key=lambda r: -waits[r])
        while rest:
            rates = [(self.rate(chosen + [r], len(ids)), -i, r) for i, r in enumerate(rest) if self._in_time(chosen + [r], waits)]
            if not rates:
                break
            top, _, pick = max(rates)
            if top <= best:
                break
            chosen.append(pick)
            rest.remove(pick)
            best = top
        if len(chosen) < len(ids) and self.rate(ids, len(ids)) >= best and self._in_time(ids, waits):
            chosen = list(ids)  # everyone together is at least as fast as any turn-taking
        if set(chosen) != set(self.current):
            self.switches += 1
        self.current = chosen
        self._joint = float(self.joint_size(chosen).mean())
        if not keep_turn or len(chosen) == len(ids) or self.turn_ends == math.inf:
            step = self.costs.step_s(len(chosen), self._misses(chosen))
            self.turn_ends = now + self._quantum(len(chosen), len(ids), step)

    def _in_time(self, ids: list[str], waits: dict[str, float]) -> bool:
        """Whether a step of `ids` ends before any of them passes the wait bound."""
        return max(waits[r] for r in ids) + self.costs.step_s(len(ids), self._misses(ids)) <= self.max_wait_s

    def _answer(self, ready: list, chosen: list) -> list:
        if chosen:
            self._width_steps[len(chosen)] += 1
        self._last = (len(chosen), len(ready) - len(chosen))
        return chosen
