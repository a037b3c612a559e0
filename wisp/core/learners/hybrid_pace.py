"""`CpuPace`: how fast hybrid mode's two servers really run in this process, learned while it serves: the
CPU's experts (`factor`) and, in the rank share, the GPU's in-place reads (`link_factor`).

The start-up probe (`wisp.core.learners.hybrid_probe`) times the CPU kernel alone. In a step the CPU also shares
host memory with the copies in flight and pays the rows' trips both ways, and a host's speed drifts. So every
hybrid step that uses the CPU measures its wall time, from the assignment until both sides are done (the CPU's rows
computed, then a wait on the GPU's side); when the model's next step begins, the step's ratio, its layers' wall
over their predicted times, joins the window. The assignment then uses the CPU's costs times `factor`, the median
of the last WINDOW steps' ratios once there are MIN_RATIOS of them: a CPU slower in practice than in the probe
gets fewer experts, and one that cannot help gets none. Why a median over steps, not one step's ratio:
docs/decisions/cpu-pace-is-a-median-of-steps.md.

Where the CPU cannot help any step of a batch (with the scaled costs, one CPU expert of one row plus
the overhead is no faster than the copies it would leave: `cpu_can_help`), the step is a paged step, so
it may run as paged mode's CUDA graph (`graph_step_ok`). Every EXPLORE_EVERY steps one step runs with the
probe's costs unscaled and a cleared window (`begin_step`), eagerly, so a CPU that was slow for a while
(start-up, a noisy neighbour) is measured again. A CPU the probe timed too slow gets no expert even then, so
no step measures it: where no step used the CPU since the last exploration (or, the first time, by step
FIRST_RETIME), that step first re-times one CPU expert of one row (`retime_due`, `retimed`: the caller times it), and the probe's CPU side follows
the faster time from then on (`probe_scale`, never above 1: only the probe's own error is corrected this way).

Each ratio is the CPU side's own time (the hybrid steps give it through `observe`'s `ratio`) against its
time at the probe's costs: not against the scaled costs the assignment used (the factor would settle at the square
root of the CPU's real slowness), and not the wall (at the assignment's optimum the copies' side is as long as the
CPU's, so the wall measures the link).

The rank share (`wisp.core.experts.rank_share`) reads its GPU's pairs in place, which the probe prices as pinned
copies, and that price can be wrong too (the CPU reads the same host memory meanwhile). So that side is paced
too: each rank-share layer's GPU pairs graph, timed on the device between two CUDA events (whichever side finished
last; the span also holds the graph's launch and zero-fill), against its pairs' time at the probed copy price,
gives the step a link ratio, and `copy_s` is scaled by `link_factor`, the median of the window's link ratios,
on the same rules (MIN_RATIOS, WINDOW, clamps, exploration). A step with no GPU pairs (a CPU share of every
rank) adds no link ratio, so there the factor holds until the next exploration (EXPLORE_EVERY steps). Only the
rank share measures it: the eager step's and `cpu_can_help`'s copy price is the probe's times whatever factor
the rank share learnt. Why each side is learnt apart: docs/decisions/cpu-pace-learns-each-side-apart.md.

Invariants: `factor` and `link_factor` are 1 until MIN_RATIOS steps' ratios are recorded, change only
between steps, and are always within [MIN_FACTOR, MAX_FACTOR]; an exploring step uses the probe's costs as
re-timed (`probe_scale` in (0, 1]); one `CpuPace` serves every layer of a model (one host), and at most one layer
re-times the CPU a step.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, replace

from wisp.core.learners.hybrid_costs import HybridCosts

WINDOW = 16  # steps' ratios kept
MIN_RATIOS = 3  # steps the window needs before it scales anything (a median of three outvotes one cold step)
EXPLORE_EVERY = 128  # steps between re-measurements with the probe's costs
FIRST_RETIME = 8  # the step that re-times a CPU no step has used yet, before the first exploration
MIN_FACTOR, MAX_FACTOR = 0.5, 16.0


@dataclass
class PaceTotals:
    """Sums over every CPU step since load (for stats: where a CPU step's time went)."""

    steps: int = 0
    wall_s: float = 0.0  # the CPU's side, then any wait for the GPU's (the rank share under graphs: the later side)
    predicted_s: float = 0.0  # what the assignments (or rank shares) predicted
    kernel_s: float = 0.0  # the CPU kernels alone
    routing_wait_s: float = 0.0  # rank share only: the host waiting for a layer's routing (the piece's GPU time)
    gpu_wait_s: float = 0.0  # rank share only: the GPU's pairs past the CPU's side (under graphs: device-timed)
    cpu_ranks: float = 0.0  # rank share only: the sum of each CPU layer-step's share of ranks n (/ steps: the mean)
    gpu_s: float = 0.0  # rank share under graphs only: the GPU's pairs graph, timed on the device (CUDA events)


class CpuPace:
    def __init__(self, window: int = WINDOW, explore_every: int = EXPLORE_EVERY, learn: bool = True,
                 min_ratios: int = MIN_RATIOS, retime: bool = True):
        """learn=False: record totals but keep the probe's costs as they are (a policy at fixed costs, as
        `wisp.plan.hybrid_cost` replays it). retime=False: costs given rather than probed are never re-timed."""
        if window < 1 or explore_every < 1 or not 1 <= min_ratios <= window:
            raise ValueError("window and explore_every must be positive, and 1 <= min_ratios <= window")
        self.learn, self.min_ratios, self.retime = learn, min_ratios, retime
        self.ratios: deque[float] = deque(maxlen=window)
        self._factor = 1.0  # median(ratios), or 1 while fewer than min_ratios
        self._open = [0.0, 0.0]  # the current step's CPU layers so far: wall, predicted
        self.link_ratios: deque[float] = deque(maxlen=window)
        self._link_factor = 1.0  # median(link_ratios), or 1 while fewer than min_ratios
        self._open_link = [0.0, 0.0]  # the current step's GPU pairs so far: device-timed, at the probed copy price
        self.explore_every = explore_every
        self.step = 0  # the last step number begun
        self.exploring = False
        self._scaled: tuple[int, tuple[float, float], HybridCosts] | None = None  # (id of costs, factors, scaled)
        self.totals = PaceTotals()
        self.probe_scale = 1.0  # the probe's CPU times corrected by re-timing (`retimed`): at most 1
        self._used_at_exploration = 0  # totals.steps when the last exploring step began
        self._retime_due = False  # this exploring step should re-time the CPU (one layer does it)

    @property
    def factor(self) -> float:
        """The median of the window (1 while it holds fewer than min_ratios), kept as the window changes: every
        layer asks each step."""
        return self._factor

    @property
    def link_factor(self) -> float:
        """The GPU's in-place pairs against the probed copy price: the median of the window's link ratios."""
        return self._link_factor

    def begin_step(self, step: int) -> None:
        """Before model step number `step` runs (called by every layer; acts once per number): the previous
        step's ratios join their windows (`end_step`), and every explore_every-th step explores."""
        if step == self.step:
            return
        self.end_step()
        self.step = step
        self.exploring = step % self.explore_every == 0
        if self.exploring or step == FIRST_RETIME:  # re-time the CPU where no step used it since the last look
            self._retime_due = self.learn and self.retime and self.totals.steps == self._used_at_exploration
            self._used_at_exploration = self.totals.steps
        if self.exploring:
            self.ratios.clear()
            self._factor = 1.0
            self.link_ratios.clear()
            self._link_factor = 1.0

    def retime_due(self) -> bool:
        """Whether the caller should re-time one CPU expert of one row now (then give it to `retimed`): true once
        in an exploring step (or step FIRST_RETIME) when no step used the CPU since the previous such step."""
        due, self._retime_due = self._retime_due, False
        return due

    def retimed(self, measured_s: float, probed_s: float) -> None:
        """One CPU expert of one row timed now against the probe's price of it: the probe's CPU side is scaled to
        match from now on (`probe_scale`), never above the probe's own (a CPU slower than probed is what the
        steps that use it measure)."""
        if measured_s > 0 and probed_s > 0:
            self.probe_scale = min(1.0, measured_s / probed_s)

    def observe(self, wall_s: float, predicted_s: float, kernel_s: float = 0.0, routing_wait_s: float = 0.0,
                gpu_wait_s: float = 0.0, *, ratio: tuple[float, float] | None = None,
                link: tuple[float, float] | None = None, cpu_ranks: float = 0.0, gpu_s: float = 0.0) -> None:
        """One layer's CPU step: its wall time, the assignment's prediction (at the costs it was made with), the CPU
        kernels' share of the wall, and (stats only) the host's waits before it and, within it, on the GPU's
        side. `ratio`: (observed, predicted at the probe's costs), what the step's ratio is made of; without
        it, the wall against `predicted_s` (a caller that assigns at the probe's costs). `link`: (the GPU's
        pairs timed on the device, their time at the probed copy price), what the step's link ratio is made
        of. `cpu_ranks`, `gpu_s`: stats only."""
        t = self.totals
        t.steps += 1
        t.wall_s += wall_s
        t.predicted_s += predicted_s
        t.kernel_s += kernel_s
        t.routing_wait_s += routing_wait_s
        t.gpu_wait_s += gpu_wait_s
        t.cpu_ranks += cpu_ranks
        t.gpu_s += gpu_s
        observed_s, at_probe_s = ratio or (wall_s, predicted_s)
        self._open[0] += observed_s
        self._open[1] += at_probe_s
        if link is not None:
            self._open_link[0] += link[0]
            self._open_link[1] += link[1]

    def end_step(self) -> None:
        """The current step's CPU layers are done: their CPU time over its prediction joins the window, and
        their GPU pairs' device time over its copy price joins the link window (each: nothing if the step
        predicted nothing for it, or while not learning)."""
        wall_s, predicted_s = self._open
        gpu_s, at_copy_s = self._open_link
        self._open, self._open_link = [0.0, 0.0], [0.0, 0.0]
        if self.learn and predicted_s > 0:
            self.ratios.append(min(MAX_FACTOR, max(MIN_FACTOR, wall_s / predicted_s)))
            if len(self.ratios) >= self.min_ratios:
                self._factor = statistics.median(self.ratios)
        if self.learn and at_copy_s > 0:
            self.link_ratios.append(min(MAX_FACTOR, max(MIN_FACTOR, gpu_s / at_copy_s)))
            if len(self.link_ratios) >= self.min_ratios:
                self._link_factor = statistics.median(self.link_ratios)

    def costs(self, probed: HybridCosts) -> HybridCosts:
        """The costs an assignment should use now: the probe's (its CPU side as re-timed: `probe_scale`), with the
        CPU's times scaled by `factor` and the copy's by `link_factor` (unscaled while exploring)."""
        factors = (1.0, 1.0) if self.exploring else (self.factor, self.link_factor)
        factors = (factors[0] * self.probe_scale, factors[1])
        if factors == (1.0, 1.0):
            return probed
        cached = self._scaled
        if cached is None or cached[0] != id(probed) or cached[1] != factors:
            cpu, link = factors
            scaled = replace(probed, cpu_s_at_rows=tuple(s * cpu for s in probed.cpu_s_at_rows),
                             cpu_overhead_s=probed.cpu_overhead_s * cpu, copy_s=probed.copy_s * link)
            self._scaled = cached = (id(probed), factors, scaled)
        return cached[2]

    def cpu_can_help(self, probed: HybridCosts, max_misses: int) -> bool:
        """Whether some step with at most `max_misses` misses would send an expert to the CPU: the
        cheapest CPU expert (one row) plus the overhead beats the copies it could stand beside."""
        costs = self.costs(probed)
        return max_misses >= 2 and costs.cpu_overhead_s + costs.cpu_s(1) < max_misses * costs.copy_s

    def graph_step_ok(self, probed: HybridCosts, max_misses: int) -> bool:
        """Whether a step of at most `max_misses` misses per layer may run as a paged CUDA-graph step."""
        return not self.exploring and not self.cpu_can_help(probed, max_misses)
