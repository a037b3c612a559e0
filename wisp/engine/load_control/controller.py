"""LoadController: which of the running requests that are ready to decode decode this step.

The scheduler asks `choose(ready, now)` every step. The answer is the decode set with the highest predicted
aggregate rate, kept for a turn, under a bound on any request's wait between two of its tokens:

- **Prediction.** A set's joint working set u per layer is the union of its members' working sets
  (`WorkingSets`; a request with no decode history yet counts as `unknown_experts` experts of its own). With C
  slots a layer, a step that routes d = min(u, b x top_k) distinct experts misses about d x (1 - C / u) of
  them when u > C (an LRU cache of C items over u items referenced at random hits C / u), and none when it
  fits (a working set's slow drift is learned into the compute: `DecodeStepCosts.observe`). Working sets are
  read at a sample of the MoE layers; misses are scaled by `layer_scale` to every layer.
- **Turns.** When the chosen set is not every ready request, the ready requests take turns in groups: with
  G = ceil(ready / set size) groups a turn lasts (max_wait - 2 x lead) / (G - 1), where a request's lead is one
  step of the set in its turn and then its own first step, reloading its working set (what it needs beyond what
  the set in its turn holds).
  A set's rate is discounted by that reload: rate = b / step_s x turn / (turn + reload). Everyone decoding
  together is the alternative it must beat, at no discount.
- **Revisits.** Everyone decoding together has no turn, but working sets drift: the choice is made afresh once
  per `max_wait_s`, so that a set found best when the working sets overlapped does not outlive them.
- **Choice.** A new set is grown greedily from a seed (the longest-waiting request at a turn, the due ones when
  some are due, the set in its turn when a request arrives or leaves): the request that raises the predicted
  rate most joins, while the step still ends within every member's bound, until none raises it.
- **Fairness.** A ready request outside the set is due when its wait plus its lead reaches the bound: it seeds a
  new choice at once (earliest deadline first). Requests near their bound together may come due together, so a
  lead's own step is the larger of the request's alone and the step of all of them together; and a lead assumes
  one more step of the set in its turn, so a set chosen at a turn or an arrival, whose step may be longer, is
  checked again and any request it would bring to its bound is due at once. No request starves: the longest
  waiter seeds every turn.
- **Fixed width** (`fixed_width`, `--load-control width:N`): the baseline it is measured against. The set is the
  seed and the longest waiters up to N requests, whatever the working sets, with the same turns and deadlines.
- **Learning.** A decode step's seconds teach the compute of its width, except in the first `settle` steps
  after the set changed (they reload working sets) and while a member's working set is unknown.

Invariants: the answer is a non-empty subset of `ready` in `ready`'s order whenever `ready` is non-empty; when the
predicted rate of everyone together is the highest (every joint set fits: C = N, or small working sets), it is
all of `ready`; a due request is always in it. Which requests decode never changes what they compute: a
request's tokens do not depend on its batch (the engine's batch invariance).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np

from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.engine.load_control.working_sets import WorkingSets

log = logging.getLogger("wisp.load_control")


@dataclass(frozen=True)
class LoadControlState:
    """Where load control stands (engine stats and /metrics)."""

    decode_width: int  # requests the last step decoded
    held_back: int  # ready requests the last step held back
    joint_working_set: float  # the current set's predicted joint working set, mean experts per MoE layer
    width_steps: dict[int, int]  # steps per decode width
    switches: int  # times the decode set changed
    overdue: int  # times a request came due (its wait near the bound) and seeded the set


class LoadController:
    def __init__(self, working_sets: WorkingSets, costs: DecodeStepCosts, caps: Seq[int], max_wait_s: float,
                 unknown_experts: int | None = None, layer_scale: float = 1.0, settle: int = 2,
                 fixed_width: int | None = None):
        """caps: each sampled MoE layer's slots, in the working sets' layer order; unknown_experts: the working set
        assumed per layer for a request with no decode history (default 2 x top_k, at most the experts);
        layer_scale: MoE layers per sampled layer."""
        self.ws, self.costs = working_sets, costs
        self.caps = np.asarray(caps, dtype=np.float64)  # [L sampled]
        self.max_wait_s, self.layer_scale, self.settle = max_wait_s, layer_scale, settle
        self.fixed_width = fixed_width
        k, n = working_sets.top_k, working_sets.num_experts
        self.unknown_experts = min(n, 2 * k) if unknown_experts is None else unknown_experts
        self.current: list[str] = []  # the decode set, in the order chosen
        self.turn_ends = math.inf  # when the current set's turn ends (everyone decoding: when to look again)
        self._revisit = True  # turn_ends is a revisit of everyone decoding, not a turn
        self._since_change = 0  # decode steps since the set last changed
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
        due = self._due(ids, waits)
        if not due:
            if now >= self.turn_ends or not set(self.current) & set(ids):
                self._decide(ids, waits, now, seed=[max(ids, key=lambda r: (waits[r], -ids.index(r)))], why="turn")
            elif frozenset(ids) != self._ready_ids:  # a request arrived or left: grow from the set in its turn
                self._decide(ids, waits, now, seed=[r for r in self.current if r in waits], why="arrival", keep_turn=True)
            due = self._due(ids, waits)  # a new set's step may be longer than the one the leads assumed
        if due:
            self.overdue_count += len(due)
            self._decide(ids, waits, now, seed=sorted(due, key=lambda r: -waits[r]), why="due")
        self._ready_ids = frozenset(ids)
        members = set(self.current)
        return self._answer(ready, [s for s in ready if s.request_id in members])

    def observe_step(self, width: int, seconds: float) -> None:
        """A decode step of `width` rows (the current set, or the one ready request) took `seconds`."""
        self._since_change += 1
        members = self.current if width == len(self.current) else []
        if self._since_change > self.settle and all(self.ws.known(r) for r in members):
            self.costs.observe(width, seconds, self._misses(members))

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
        """[L sampled] predicted joint working set of `ids` (unknown requests each add `unknown_experts`)."""
        unknown = sum(1 for r in ids if not self.ws.known(r))
        return np.minimum(self.ws.joint_size(ids) + unknown * self.unknown_experts, self.ws.num_experts).astype(np.float64)

    def _misses(self, ids: Seq[str]) -> float:
        """Predicted experts a steady decode step of `ids` copies, over every MoE layer."""
        if not ids:
            return 0.0
        u = self.joint_size(ids)
        distinct = np.minimum(u, len(ids) * self.ws.top_k)
        return float((distinct * np.clip(1 - self.caps / np.maximum(u, 1), 0, None)).sum()) * self.layer_scale

    def _reload(self, ids: Seq[str], held: Seq[str] = ()) -> float:
        """Experts (over every MoE layer) that `ids` need in the slots beyond what `held`'s working set leaves there."""
        need = self.joint_size(list(ids) + list(held)) - self.joint_size(held) if held else self.joint_size(ids)
        return float(np.minimum(need, self.caps).sum()) * self.layer_scale

    @property
    def _full_reload(self) -> float:
        """Experts (over every MoE layer) that refill every slot: the most any reload copies."""
        return float(self.caps.sum()) * self.layer_scale

    def _lead(self, rid: str, current_step: float) -> float:
        """A step of the current set, then `rid`'s first step reloading its working set: the warning `rid` needs."""
        return current_step + self.costs.step_s(1, self._reload([rid], self.current))

    def _due(self, ids: list[str], waits: dict[str, float]) -> list[str]:
        """The ready requests outside the set whose wait, plus their lead, reaches the bound. Those near it may come
        due together and seed one set, so a request's own step in its lead is the larger of its alone (reloading its
        working set) and that group's (`near`: every request the widest such step could bring to its bound)."""
        members = [r for r in self.current if r in waits]
        current_step = self.costs.step_s(max(len(members), 1), self._misses(members))
        others = [r for r in ids if r not in members]
        widest = current_step + self.costs.step_s(max(len(others), 1), self._full_reload)  # the longest lead
        near = [r for r in others if waits[r] + widest >= self.max_wait_s]
        if not near:
            return []
        group = current_step + self.costs.step_s(len(near), max(self._misses(near), self._reload(near, self.current)))
        return [r for r in near if waits[r] + max(self._lead(r, current_step), group) >= self.max_wait_s]

    def rate(self, ids: Seq[str], ready: int) -> float:
        """Predicted tokens per second of decoding `ids` while `ready` requests are ready (see the docstring)."""
        b = len(ids)
        step = self.costs.step_s(b, self._misses(ids))
        if b >= ready:
            return b / step
        turn = self._turn(b, ready)
        reload_s = self._reload(ids) * self.costs.copy_s
        return b / step * turn / (turn + reload_s)

    def _turn(self, b: int, ready: int) -> float:
        groups = -(-ready // b)
        if groups <= 1:
            return math.inf
        lead = self.costs.compute_s(b) + self.costs.step_s(1, self._full_reload)
        return max(self.max_wait_s - 2 * lead, self.costs.compute_s(b)) / (groups - 1)

    # -- choosing ---------------------------------------------------------------------------------------
    def _decide(self, ids: list[str], waits: dict[str, float], now: float, seed: list[str], why: str,
                keep_turn: bool = False) -> None:
        chosen = list(seed) or [ids[0]]
        best = self.rate(chosen, len(ids))
        rest = sorted((r for r in ids if r not in chosen), key=lambda r: -waits[r])
        if self.fixed_width is not None:
            chosen = (chosen + rest)[: max(self.fixed_width, len(chosen))]
            rest, best = [], self.rate(chosen, len(ids))
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
        everyone = self.rate(ids, len(ids))
        if self.fixed_width is None and len(chosen) < len(ids) and everyone >= best and self._in_time(ids, waits):
            chosen, best = list(ids), everyone  # everyone together is at least as fast as any turn-taking
        if set(chosen) != set(self.current):
            self.switches += 1
            self._since_change = 0
        self.current = chosen
        self._joint = float(self.joint_size(chosen).mean())
        if not keep_turn or len(chosen) == len(ids) or self._revisit:
            turn = self._turn(len(chosen), len(ids))
            self._revisit = math.isinf(turn)  # everyone decodes: looked at again once a bound, as working sets drift
            self.turn_ends = now + (self.max_wait_s if self._revisit else turn)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %d of %d ready decode (%.1f tok/s predicted, everyone %.1f), joint working set %.1f, "
                      "turn %.3f s", why, len(chosen), len(ids), best, everyone, self._joint, self.turn_ends - now)

    def _in_time(self, ids: list[str], waits: dict[str, float]) -> bool:
        """Whether a step of `ids` ends before any of them passes the wait bound."""
        return max(waits[r] for r in ids) + self.costs.step_s(len(ids), self._misses(ids)) <= self.max_wait_s

    def _answer(self, ready: list, chosen: list) -> list:
        if chosen:
            self._width_steps[len(chosen)] += 1
        self._last = (len(chosen), len(ready) - len(chosen))
        return chosen
