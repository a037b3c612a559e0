"""LiveSplit: the online split controller (`wisp.engine.split_controller.controller.SplitController`) driving a running engine.

Registered with `LLMEngine.set_live_split`. It feeds the controller, live, what the offline planner reads
from traces:
- KV: each request's prompt blocks on arrival (the prefix cache's chain keys of its full blocks), as stack
  distances over all requests so far (`LruStack.touch_blocks`, kept no deeper than the controller reads);
- experts: each step's routing per MoE layer, in touch order (`wisp.core.experts.recency`), as stack distances
  per layer (`ExpertStacks`). The routing comes from the engine's routing replay when it keeps the step's
  rows on the host (`SessionRoutingReplay.last_rows`: no device read; set the replay before the live
  split), else from the engine's routing feed (`LLMEngine.subscribe_routing`, a log on the device shared with load
  control), drained in one read at the latest just before each re-solve (decode keeps its CUDA graphs).
  Either way a step's rows are only kept; they reach the controller in bulk (`flush`: every held step in one
  `ExpertStacks.touch_steps`) just before a re-solve, when `state()` is read, or when the held rows reach
  `HELD_TOKENS`. The curves a re-solve reads are those of each step fed as it ran (the same histogram weights
  to the last bit), so decisions are unchanged; a step between re-solves costs a list append instead of
  the stack and histogram updates (docs/decisions/live-split-feeds-the-controller-in-bulk.md).
Every `resolve_every` steps the controller may decide a resize; it is applied at once with `LLMEngine.apply_plan`
(between steps, nothing drained: outputs unchanged, no preemption while the admission floor holds). The
controller is told how long the conditions have held (seconds since the last resize or change of its KV floor)
and each resize's measured stall, for its payback rule.

Admission (with the controller's `admission_window`; docs/decisions/kv-floor-follows-the-requests-in-flight.md):
the KV floor follows the requests in flight instead of holding W x L blocks all the time. A request's context
takes at most R = ceil(L / block_size) blocks, and the engine admits at most `scheduler.max_running` =
min(W, pool blocks // R) requests, so the requests running always fit the pool and none is ever preempted for
KV. After every step the demand (running + waiting) goes to an `AdmissionFloor`; its peak over the window, times
R, is the controller's KV floor. When the demand outgrows the pool, the controller grows the pool at once (a
resize that shrinks the expert slots) and the waiting requests are admitted at the next step; re-solves shrink
the pool only down to the floor. The engine's `floor_blocks` (what `apply_plan` checks) is kept at
max_running x R: lowered before a pool shrinks, raised after it grows.
Every applied resize is logged (when, from -> to, why) and kept as a `ResizeEvent` with the seconds it
stalled serving; `host_s` adds up the rest of its time between steps (observing, deciding); `state()` is
what `/metrics` exports.

Invariants: the controller never proposes a split beyond the budget or below the floor (its own tests);
the engine's caps and pool size always equal the controller's current split after `after_step`; with admission
following the demand, len(running) <= max_running, max_running x R == engine.floor_blocks <= pool blocks, and
max_running >= 1 (a request always gets in: the pool grows after the step that admits it). `close` leaves the
admission limit where the pool holds it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from wisp.engine.block_pool import chain_hash
from wisp.engine.resize_timings import ResizeTimings
from wisp.engine.split_controller.admission_floor import AdmissionFloor
from wisp.engine.split_controller.controller import Resize, SplitController
from wisp.engine.split_controller.expert_stacks import ExpertStacks
from wisp.engine.split_controller.lru_stack import LruStack

log = logging.getLogger("wisp.controller")

HELD_TOKENS = 8192  # routed rows held before they are fed regardless (bounds the memory they take)


@dataclass(frozen=True)
class ResizeEvent:
    resize: Resize
    at_s: float  # seconds since the live split was registered
    stall_s: float  # how long applying it held the engine (pools, copies, graph capture)
    timings: ResizeTimings  # ... by part
    admission_limit: int  # requests the engine admits at once after it (scheduler.max_running)


@dataclass(frozen=True)
class SplitState:
    """What the controller decides from, and where it stands (exported live on /metrics)."""
    expert_cap: int
    kv_blocks: int
    admission_floor_blocks: int  # KV blocks re-solves keep (W x L, or the requests in flight x L)
    admission_limit: int  # requests the engine admits at once
    expert_slot_value: float  # seconds per request saved per byte by one more expert slot
    kv_block_value: float  # ... by one more KV block's bytes
    resizes: int


class LiveSplit:
    def __init__(self, engine, controller: SplitController):
        stores = engine.model.experts
        if not all(s.slots is not None for s in stores.values()):
            raise ValueError("the live split controller resizes expert slots: it needs --mode paged, or hybrid with slots")
        self.engine, self.controller = engine, controller
        self.layers = list(stores)
        self.expert_stacks = ExpertStacks(len(self.layers), engine.model_config.num_experts)
        self.kv_stack = LruStack(controller.kv_max_distance)
        self._held: list[np.ndarray] = []  # steps' routed rows not yet fed to the controller, oldest first
        self._held_tokens = 0
        self.host_s = 0.0  # seconds spent observing and deciding between steps (applying resizes: `events`)
        self.events: list[ResizeEvent] = []
        self.started = self._held_since = time.perf_counter()  # held: since the last resize or KV floor change
        self._replay = engine.runner.replay if hasattr(engine.runner.replay, "last_rows") else None
        self._feed, self._unsubscribe = None, None
        if self._replay is None:
            self._unsubscribe = engine.subscribe_routing(lambda rows, owners: self._observe_routing(rows))
            self._feed = engine.feed
        self.admission = None
        window = controller.config.admission_window
        if window is not None:
            p, request_blocks = controller.config.problem, -(-engine.max_model_len // engine.pool.block_size)
            fits = min(engine.config.max_concurrency, p.kv_blocks(p.min_cap) // request_blocks)
            if fits < 1:
                raise ValueError(f"the budget cannot hold one request's {request_blocks} KV blocks beside min_cap slots")
            self.admission = AdmissionFloor(fits, request_blocks, window)
            self._follow_demand()
        caps = {s.slots for s in stores.values()}
        if caps != {controller.expert_cap} or engine.pool.num_blocks != controller.kv_blocks:
            self._apply(controller.expert_cap, controller.kv_blocks)

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()

    # -- what it is fed -----------------------------------------------------------------------------
    def observe_request(self, prompt_ids: list[int]) -> None:
        start = time.perf_counter()
        bs, keys, parent = self.engine.pool.block_size, [], None
        for i in range(len(prompt_ids) // bs):
            parent = chain_hash(parent, prompt_ids[i * bs : (i + 1) * bs])
            keys.append(parent)
        self.controller.observe_kv(self.kv_stack.touch_blocks(keys))
        self.host_s += time.perf_counter() - start

    def _observe_routing(self, rows: np.ndarray) -> None:
        """rows [T, L, K]: a step's routed ids (-1: unknown, skipped), held until the next `flush`."""
        if not len(rows):
            return
        self._held.append(rows)
        self._held_tokens += len(rows)
        if self._held_tokens >= HELD_TOKENS:
            self.flush()

    def flush(self) -> None:
        """Feed the controller every held step's routing, in one bulk update."""
        if not self._held:
            return
        rows = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
        tokens = [len(r) for r in self._held]
        distances, refs = self.expert_stacks.touch_steps(rows, tokens)
        self.controller.observe_expert_steps(distances, refs, tokens)
        self._held, self._held_tokens = [], 0

    # -- after each step ------------------------------------------------------------------------------
    def after_step(self, tokens: int) -> ResizeEvent | None:
        """The engine computed a step of `tokens` tokens: hold its routing; before a re-solve feed what is
        held, let the controller decide, and apply a resize."""
        start = time.perf_counter()
        if self._replay is not None and self._replay.last_rows is not None:
            self._observe_routing(self._replay.last_rows)
        floor = self.controller.kv_floor
        resize = self._follow_demand() if self.admission is not None else None
        if self.controller.kv_floor != floor:
            self._held_since = start
        if resize is None:
            if (self.controller.steps + 1) % self.controller.config.resolve_every == 0:
                self._catch_up()
            resize = self.controller.step(start - self._held_since)
        self.host_s += time.perf_counter() - start
        if resize is None:
            return None
        start = time.perf_counter()
        timings = self._apply(resize.to_cap, resize.to_kv_blocks)
        self._held_since = time.perf_counter()
        event = ResizeEvent(resize, start - self.started, self._held_since - start, timings,
                            self.engine.scheduler.max_running)
        self.controller.measured_stall(event.stall_s)
        self.events.append(event)
        log.info("resize at step %d (%.1f s): expert cap %d -> %d, KV blocks %d -> %d, stalled %.3f s (KV %.3f, "
                 "experts %.3f, graphs %.3f): %s", resize.step, event.at_s, resize.from_cap, resize.to_cap,
                 resize.from_kv_blocks, resize.to_kv_blocks, event.stall_s, timings.kv_s, timings.experts_s,
                 timings.graphs_s, resize.reason)
        return event

    # -- admission ------------------------------------------------------------------------------------
    def _follow_demand(self) -> Resize | None:
        """The requests in flight set the controller's KV floor; a resize when the pool must grow for them."""
        scheduler, admission = self.engine.scheduler, self.admission
        admission.observe(len(scheduler.running) + len(scheduler.waiting))
        floor = max(self.controller.config.problem.kv_floor, admission.blocks)
        if floor > self.controller.kv_blocks:
            self._catch_up()  # the split grown into is chosen on every step seen so far
        return self.controller.require_kv_floor(floor)

    def _apply(self, cap: int, kv_blocks: int) -> ResizeTimings:
        """Resize the engine to (cap, kv_blocks), the admission limit lowered before the pool shrinks and raised
        after it grows (see the module docstring)."""
        if self.admission is None:
            return self.engine.apply_plan([cap] * len(self.layers), kv_blocks)
        scheduler = self.engine.scheduler
        limit = min(self.engine.config.max_concurrency, kv_blocks // self.admission.request_blocks)
        if limit < len(scheduler.running):
            raise AssertionError(f"a pool of {kv_blocks} blocks cannot hold the {len(scheduler.running)} requests "
                                 "running: the KV floor did not follow them")
        if limit < scheduler.max_running:
            self._admit_at_most(limit)
        timings = self.engine.apply_plan([cap] * len(self.layers), kv_blocks)
        if limit > scheduler.max_running:
            self._admit_at_most(limit)
        return timings

    def _admit_at_most(self, requests: int) -> None:
        self.engine.scheduler.max_running = requests
        self.engine.floor_blocks = requests * self.admission.request_blocks

    def _catch_up(self) -> None:
        """Everything routed so far reaches the controller (before it decides)."""
        if self._feed is not None:
            self._feed.drain()  # (the feed also drains itself before its ring fills)
        self.flush()

    @property
    def routing_rows_lost(self) -> int:
        """Logged routing rows overwritten before a drain (0 unless a step outgrew the log)."""
        return self._feed.lost if self._feed is not None else 0

    def state(self) -> SplitState:
        self.flush()
        slot_value, block_value = self.controller.marginal_values()
        c = self.controller
        return SplitState(c.expert_cap, c.kv_blocks, c.kv_floor, self.engine.scheduler.max_running, slot_value,
                          block_value, len(self.events))
