"""`StepKindChooser`: hybrid mode's choice, per decode batch size, between a CUDA-graph step and an eager one.

A hybrid decode step can run two ways. Eagerly, each layer's misses are split between copies and the
CPU (`wisp.core.hybrid_split`), which needs the routing on the host, so every layer pays a host sync and
the step's kernel launches. As paged mode's CUDA graph, it has no CPU help but no launch cost either. Which
is faster depends on the model and the cap, not on one step: on the H200 with the real Mixtral trace the
CPU's help was worth 51 ms a token at C = 2 (eager 251 ms against the graph's 302) and less than the
graph's saving at C = 4 and 6 (201 against 179, 110 against 87); on OLMoE-1B-7B the graph always won.
So the runner measures both, per batch size, by the wall time of whole steps, and runs the faster. (Where
graphs exist, the CPU-helped kind replays the graph's pieces with the experts eager between them.)

For each batch size: after `warmup` untimed steps of each kind (cold: the CPU's pace still learning its
ratio, first launches), the first `sample` decode steps run with the CPU's help (EAGER: the graph's pieces with
the experts eager between, where captured), the next `sample` as whole graphs; after that
the kind with the lower median step time runs, except that the first `sample` steps of every
`explore_every` re-measure the other kind (routing and the host change). Only consulted where both kinds
are possible and the model says the CPU could help a step (`MoEDecoder.graph_step_ok` is false); where
it cannot, the graph runs.

Invariant: the choice changes which steps use the CPU, never a token beyond the CPU's rounding (both
kinds compute the same experts' pairs; the graph's are paged mode's, bit for bit).
"""

from __future__ import annotations

import statistics
from collections import deque

GRAPH, EAGER = "graph", "eager"


class StepKindChooser:
    def __init__(self, sample: int = 8, explore_every: int = 256, warmup: int = 3):
        if sample < 1 or explore_every <= 2 * (sample + warmup) or warmup < 0:
            raise ValueError("need sample >= 1, warmup >= 0 and explore_every > 2 x (sample + warmup)")
        self.sample, self.explore_every, self.warmup = sample, explore_every, warmup
        self.untimed: dict[tuple[int, str], int] = {}  # (batch size, kind): warm-up steps seen
        self.times: dict[int, dict[str, deque[float]]] = {}
        self.picks: dict[int, int] = {}  # per batch size: decisions made

    def pick(self, batch_size: int) -> str:
        times = self._times(batch_size)
        n = self.picks[batch_size] = self.picks.get(batch_size, 0) + 1
        for kind in (EAGER, GRAPH):  # first measure both
            if len(times[kind]) < self.sample:
                return kind
        best = self.best(batch_size)
        if n % self.explore_every < self.sample:  # refresh the other kind's window now and then
            return GRAPH if best == EAGER else EAGER
        return best

    def best(self, batch_size: int) -> str | None:
        """The kind with the lower median step time, once both were measured (None before)."""
        times = self._times(batch_size)
        if any(len(t) < self.sample for t in times.values()):
            return None
        return min((GRAPH, EAGER), key=lambda kind: statistics.median(times[kind]))

    def medians(self) -> dict[str, dict[str, float]]:
        """Per batch size (as a string: JSON keys), each kind's median step time in its window so far."""
        return {str(b): {kind: round(statistics.median(t), 6) for kind, t in times.items() if t}
                for b, times in sorted(self.times.items())}

    def record(self, batch_size: int, kind: str, seconds: float) -> None:
        seen = self.untimed.get((batch_size, kind), 0)
        if seen < self.warmup:  # a cold step: not what this kind costs
            self.untimed[(batch_size, kind)] = seen + 1
            return
        self._times(batch_size)[kind].append(seconds)

    def _times(self, batch_size: int) -> dict[str, deque[float]]:
        if batch_size not in self.times:
            self.times[batch_size] = {GRAPH: deque(maxlen=self.sample), EAGER: deque(maxlen=self.sample)}
        return self.times[batch_size]
