"""`StepKindChooser`: hybrid mode's choice, per decode batch size, between a CUDA-graph step and an eager one.

A hybrid decode step can run two ways. Eagerly, each layer's misses are assigned to copies or the CPU
(`wisp.core.experts.cpu_assignment`), which needs the routing on the host, so every layer pays a host sync and
the step's kernel launches. As paged mode's CUDA graph, it has no CPU help but no launch cost either. Which
is faster depends on the model and the cap, not on one step, so the runner measures both, per batch size, by
the wall time of whole steps, and runs the faster (docs/decisions/hybrid-step-kind-chosen-by-measurement.md).
(Where graphs exist, the CPU-helped kind replays the graph's pieces with the experts eager between them.)

For each batch size: after untimed steps of each kind (cold: `warmup` CPU-helped steps, the CPU's pace still
learning its ratio, first launches; `graph_warmup` graph steps, the first replay: a graph replays the same
work every step), the first `least` decode steps run with the CPU's help (EAGER: the graph's pieces with
the experts eager between, where captured), the next `least` as whole graphs. As soon as the last `least`
steps of one kind all beat the last `least` of the other, that kind runs; sooner, as soon as each kind has a
timed step, where every step of one kind takes more than `decisive` times the other's slowest (then each
later exploration of the graph stops after its first step: a graph replays the same work every step, while a
CPU-helped step after a long rest can be cold, so its explorations keep the `least` rule); until then the
CPU-helped kind, then the graph, is measured up to `sample` steps, and the one with the lower median of its
recent steps runs (recent, not all: a process's first CPU-helped steps can be slow). Every `explore_every`
steps the other kind is measured again for up to `sample` steps (routing and the host change), fewer when
its first `least` are again all slower than every step in the runner's window. Only consulted where both
kinds are possible and the model says the CPU could help a step (`MoEDecoder.graph_step_ok` is false); where
it cannot, the graph runs.

Invariant: the choice changes which steps use the CPU, never a token beyond the CPU's rounding (both
kinds compute the same experts' pairs; the graph's are paged mode's, bit for bit).
"""

from __future__ import annotations

import statistics
from collections import deque

GRAPH, EAGER = "graph", "eager"


class StepKindChooser:
    def __init__(self, sample: int = 8, explore_every: int = 256, warmup: int = 3, least: int = 3,
                 graph_warmup: int = 1, decisive: float = 1.5):
        """`least`: the steps of each kind after which a clear-cut difference decides (at most `sample`);
        `decisive`: the ratio past which one timed step of each kind decides."""
        if (sample < 1 or explore_every <= 2 * sample + warmup + graph_warmup or min(warmup, graph_warmup) < 0
                or least < 1 or not decisive > 1):
            raise ValueError("need sample >= 1, least >= 1, warm-ups >= 0, decisive > 1 and "
                             "explore_every > 2 x sample + both warm-ups")
        self.decisive = decisive
        self.sample, self.explore_every = sample, explore_every
        self.warmup = {EAGER: warmup, GRAPH: graph_warmup}
        self.least = min(least, sample)
        self.untimed: dict[tuple[int, str], int] = {}  # (batch size, kind): warm-up steps seen
        self.times: dict[int, dict[str, deque[float]]] = {}
        self.picks: dict[int, int] = {}  # per batch size: decisions made
        self.chosen: dict[int, str] = {}  # per batch size: the kind last decided on

    def pick(self, batch_size: int) -> str:
        times = self._times(batch_size)
        n = self.picks[batch_size] = self.picks.get(batch_size, 0) + 1
        best = self.best(batch_size)
        if best is None:  # measure both: `least` steps each, then up to `sample` unless that decided
            for count in (self.least, self.sample):
                for kind in (EAGER, GRAPH):
                    if len(times[kind]) < count:
                        return kind
        other = GRAPH if best == EAGER else EAGER
        explored = n % self.explore_every  # this exploration's steps so far (from 0 at its start)
        # an exploration of the graph ends at its first step where that step is decisively slower: a graph replays
        # the same work every step. Not one of CPU-helped steps: the first after a long rest can be cold (and a
        # requested CPU-helped step the runner ran as the graph leaves no new CPU-helped step to judge)
        latest = list(times[other])[-1:] if explored and other == GRAPH else []
        if explored < self.sample and not (explored >= self.least and _all_slower(
                list(times[other])[-self.least:], times[best])) and not _all_slower(latest, times[best], self.decisive):
            return other  # refresh the other kind's window now and then
        return best

    def best(self, batch_size: int) -> str | None:
        """The kind to run: the other's every step is more than `decisive` times its slowest (both kinds timed);
        once both kinds have `least` steps, the one whose last `least` steps all beat the other's last `least`;
        once both have `sample`, the one with the lower median; in between, the kind decided last (one slow step
        of the winner does not reopen the measuring); None before any decision."""
        times = self._times(batch_size)
        eager, graph = times[EAGER], times[GRAPH]
        for slow, fast in ((GRAPH, EAGER), (EAGER, GRAPH)):
            if _all_slower(times[slow], times[fast], self.decisive):
                self.chosen[batch_size] = fast
                return fast
        if min(len(eager), len(graph)) < self.least:
            return self.chosen.get(batch_size)  # a decisive choice stands while the loser's window is short
        recent_eager, recent_graph = list(eager)[-self.least:], list(graph)[-self.least:]
        if _all_slower(recent_graph, recent_eager):
            best = EAGER
        elif _all_slower(recent_eager, recent_graph):
            best = GRAPH
        elif min(len(eager), len(graph)) >= self.sample:
            best = min((GRAPH, EAGER), key=lambda kind: statistics.median(times[kind]))
        else:
            return self.chosen.get(batch_size)
        self.chosen[batch_size] = best
        return best

    def medians(self) -> dict[str, dict[str, float]]:
        """Per batch size (as a string: JSON keys), each kind's median step time in its window so far."""
        return {str(b): {kind: round(statistics.median(t), 6) for kind, t in times.items() if t}
                for b, times in sorted(self.times.items())}

    def windows(self) -> dict[str, dict[str, list[float]]]:
        """Per batch size (as a string), each kind's timed steps in its window, oldest first (why a choice
        was made: a clear-cut difference, or the medians)."""
        return {str(b): {kind: [round(s, 6) for s in t] for kind, t in times.items() if t}
                for b, times in sorted(self.times.items())}

    def record(self, batch_size: int, kind: str, seconds: float) -> None:
        seen = self.untimed.get((batch_size, kind), 0)
        if seen < self.warmup[kind]:  # a cold step: not what this kind costs
            self.untimed[(batch_size, kind)] = seen + 1
            return
        self._times(batch_size)[kind].append(seconds)

    def _times(self, batch_size: int) -> dict[str, deque[float]]:
        if batch_size not in self.times:
            self.times[batch_size] = {GRAPH: deque(maxlen=self.sample), EAGER: deque(maxlen=self.sample)}
        return self.times[batch_size]


def _all_slower(slow, fast, ratio: float = 1.0) -> bool:
    """Whether every time in `slow` is above `ratio` times every time in `fast` (both non-empty)."""
    return bool(slow) and bool(fast) and min(slow) > ratio * max(fast)
