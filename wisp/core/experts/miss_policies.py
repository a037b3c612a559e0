"""Miss policies: how a layer step's routed experts are served, the second of an expert store's three parts.

A policy's `assign(step, residency, cpu, staging)` reads the step's routing (`RoutedStep`), asks the residency
what it holds (and, with slots, where misses go), and returns a `ServePlan` (`wisp.core.experts.serve_plan`):
each routed expert HELD, COPY, STAGE, IN_PLACE or CPU. It moves no bytes; the executor runs the plan and counts
it. A new policy is one class registered here by name; `wisp.core.experts.presets` combines it with a residency.

Registered (`MISS_POLICIES`):
- "copy": every miss crosses the link once: into the slot it keeps (the pager's LRU decision), or, in a wide step
  whose experts outnumber the slots, through a staging buffer; with a full bank or a layer buffer nothing misses;
- "in-place": the GPU's kernel reads each miss in place (UVA); a wide step (each expert routed `STREAM_REUSE`
  times or more on average) stages each miss once instead, and takes held experts from the bank;
- "copy-or-cpu": "copy", with `assign_misses` sending some misses to the CPU where that shortens the step;
- "in-place-or-cpu": "in-place", with `assign_misses` sending some of the in-place reads to the CPU (priced as
  copies); wide steps stage as "in-place" does. Its decode steps may also share each token's ranks with the
  CPU inside CUDA graphs (`rank_share`: `wisp.core.experts.rank_share`).

Invariants: the plan names every routed expert once; a policy that sends nothing to the CPU gives the plan its
CPU-free twin gives ("copy-or-cpu" -> "copy", "in-place-or-cpu" -> "in-place"), so outputs and counters match.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from wisp.core.experts.cpu_server import CpuServer
from wisp.core.experts.pager import plan_of_decision
from wisp.core.experts.residency import Residency
from wisp.core.experts.serve_plan import Serve, ServePlan
from wisp.core.experts.registry import registrar

MISS_POLICIES: dict[str, type["MissPolicy"]] = {}
STREAM_REUSE = 2  # stage a step's experts when its pairs number at least this many times its experts


register_policy = registrar(MISS_POLICIES)  # @register_policy("name") on a class registers it


@dataclass(frozen=True)
class RoutedStep:
    """One layer step's routing as read on the host."""

    order: tuple[int, ...]  # distinct routed experts in touch order
    counts: tuple[int, ...]  # [N] pairs routed to each expert
    tokens: int  # T
    pairs: int  # T x top_k


class MissPolicy(ABC):
    name: str
    needs_cpu = False  # the store gives it a `CpuServer`
    rank_share = False  # its decode steps may share each token's ranks between the GPU and the CPU in graphs

    @abstractmethod
    def assign(self, step: RoutedStep, residency: Residency, cpu: CpuServer | None, staging: bool) -> ServePlan:
        """The step's serve plan (`staging`: the store has staging buffers for wide steps)."""


@register_policy("copy")
class CopyMisses(MissPolicy):
    def assign(self, step, residency, cpu, staging):
        filled = residency.begin(step.counts, step.tokens)
        plan = plan_of_decision(step.order, residency.place(step.order), step.counts)
        # narrow: every routed expert fits the device at once, so none of them is evicted before the kernel runs
        return replace(plan, filled=filled, single_launch=len(step.order) <= residency.capacity)


def wide(step: RoutedStep, staging: bool) -> bool:
    """A step whose experts are each routed `STREAM_REUSE` times or more on average: staging each once is cheaper
    than reading it in place once per pair."""
    return staging and step.pairs >= STREAM_REUSE * len(step.order)


def staged_plan(step: RoutedStep, residency: Residency) -> ServePlan:
    """A wide step with no slots: held experts from the bank (after the residency observed the step, weighed as
    one token's), every other one staged once, in touch order."""
    filled = residency.begin(step.counts, step.tokens)
    serve = {e: Serve.HELD if residency.holds(e) else Serve.STAGE for e in step.order}
    staged = tuple(e for e in step.order if serve[e] is Serve.STAGE)
    return ServePlan(step.order, step.counts, serve, staged=staged, filled=filled)


@register_policy("in-place")
class ReadInPlace(MissPolicy):
    def assign(self, step, residency, cpu, staging):
        if wide(step, staging):
            return staged_plan(step, residency)
        filled = residency.begin(step.counts, 1)
        serve = {e: Serve.HELD if residency.holds(e) else Serve.IN_PLACE for e in step.order}
        return ServePlan(step.order, step.counts, serve, filled=filled,
                         single_launch=all(w is Serve.IN_PLACE for w in serve.values()))


@register_policy("copy-or-cpu")
class CopyOrCpu(MissPolicy):
    needs_cpu = True

    def assign(self, step, residency, cpu, staging):
        residency.use_host()
        assignment = cpu.assign([(e, step.counts[e]) for e in step.order if not residency.holds(e)])
        if not assignment.to_cpu:
            return CopyMisses().assign(step, residency, cpu, staging)
        on_cpu = set(assignment.to_cpu)
        gpu_order = tuple(e for e in step.order if e not in on_cpu)
        gpu = plan_of_decision(gpu_order, residency.place(gpu_order), step.counts)  # the pager sees the GPU's experts
        return replace(gpu, order=step.order, serve={**gpu.serve, **{e: Serve.CPU for e in assignment.to_cpu}},
                       on_cpu=assignment.to_cpu, cpu_predicted_s=assignment.predicted_s)


@register_policy("in-place-or-cpu")
class InPlaceOrCpu(MissPolicy):
    needs_cpu = True
    rank_share = True

    def assign(self, step, residency, cpu, staging):
        if wide(step, staging):
            return staged_plan(step, residency)
        filled = residency.begin(step.counts, 1)  # an eager narrow step: every pair counted, as the rank share counts
        held = [e for e in step.order if residency.holds(e)]
        assignment = cpu.assign([(e, step.counts[e]) for e in step.order if not residency.holds(e)])
        serve = {e: Serve.HELD for e in held}
        serve.update({e: Serve.IN_PLACE for e in assignment.to_copy})
        serve.update({e: Serve.CPU for e in assignment.to_cpu})
        return ServePlan(step.order, step.counts, serve, on_cpu=assignment.to_cpu, filled=filled,
                         cpu_predicted_s=assignment.predicted_s, single_launch=not assignment.to_cpu and not held)
