"""RoutingFeed: every step's routing logged on the device and handed, per request, to whoever reads it.

The feed is what the model's `routing_log` slot holds (`ModelRunner.set_routing_log`). It wraps a
`wisp.engine.routing_log.RoutingLog` (device ring, graph-safe: captured decode graphs log each replay) and
remembers, on the host, each step's batch: the request and token count of each of its rows, in batch order
(`begin_step`, called by the runner as a step begins). `drain()` reads the ring in one copy and hands every
logged step to the subscribers as (rows [T, L, K], owners), where owners[i] is (request id, is a decode token)
for row i, or None for a step run outside the scheduler (a teacher-forced `prompt_logits`).

Steps are matched by number: the ring stamps each step with its own count, and the feed numbers the batches it
was told of the same way; a graph capture's warm-up steps (logged, never begun) are dropped at `reset`, which
the runner calls after every capture, after handing the steps logged before it to the subscribers.

Each subscriber names the MoE layers it reads (None: all); the feed logs the union of them, and hands each
subscriber the rows of its own layers [T, its L, K]. A subscriber asking for layers not logged yet makes the
feed log them from the next step on (`subscribe` says so: the caller re-captures graphs, which log into it).

Invariant: a subscriber sees each logged step at most once, in the order the steps ran, with its rows in batch
order; a step whose rows were overwritten before a drain is lost (counted in `lost`), never misattributed.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np
import torch

from wisp.engine.routing_log import RoutingLog

Owners = list[tuple[str, bool]] | None
Subscriber = Callable[[np.ndarray, Owners], None]


class RoutingFeed:
    def __init__(self, moe_layer_ids: list[int], top_k: int, device: torch.device, largest_step: int):
        """moe_layer_ids: every MoE layer; largest_step: the most tokens a step may compute (the ring keeps four)."""
        self.moe_layer_ids, self.top_k, self.device = list(moe_layer_ids), top_k, device
        self.largest_step = largest_step
        self.log: RoutingLog | None = None  # made by the first subscriber, over the layers subscribers read
        self.logged: list[int] = []
        self.subscribers: list[Subscriber] = []
        self._layers: dict[int, list[int]] = {}  # id(subscriber) -> the layers it reads
        self._owners: deque[Owners] = deque()  # the begun steps not yet drained, oldest first
        self._first = 0  # the step number of _owners[0]
        self._rows_since_drain = 0

    @property
    def lost(self) -> int:
        return self.log.lost if self.log is not None else 0

    def subscribe(self, subscriber: Subscriber, layers: list[int] | None = None) -> tuple[Callable[[], None], bool]:
        """Hand every drained step's rows of `layers` (MoE layer ids; None: all) to `subscriber` from now on.
        Returns the call that stops it, and whether the feed now logs more layers than before (captured graphs
        log the old set: re-capture them)."""
        layers = self.moe_layer_ids if layers is None else list(layers)
        self.subscribers.append(subscriber)
        self._layers[id(subscriber)] = layers
        grew = not set(layers) <= set(self.logged)
        if grew:
            if self.log is not None:
                self.drain()
            self.logged = [li for li in self.moe_layer_ids if li in set(self.logged) | set(layers)]
            self.log = RoutingLog(self.logged, self.top_k, self.device, 4 * self.largest_step)
            self._owners.clear()
            self._first = self._rows_since_drain = 0

        def stop() -> None:
            if subscriber in self.subscribers:
                self.subscribers.remove(subscriber)
                self._layers.pop(id(subscriber), None)
        return stop, grew

    # -- what the model and the runner call -------------------------------------------------------------
    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        if self.log is not None:
            self.log.record(layer, topk_ids)

    def begin_step(self, batch) -> None:
        """A step begins: `batch` is a `wisp.engine.scheduler.Batch`, or None (a forward outside the scheduler).
        Drains first when the ring could not hold one more step."""
        if self.log is None:
            return
        if self._rows_since_drain + self.largest_step > self.log.capacity:
            self.drain()
        if batch is None:
            self._owners.append(None)
            return
        owners, tokens = [], 0
        for seq, n in zip(batch.seqs, batch.num_tokens):
            decode = n == 1 and bool(seq.output_ids)
            owners.extend([(seq.request_id, decode)] * n)
            tokens += n
        self._owners.append(owners)
        self._rows_since_drain += tokens

    def reset(self) -> None:
        """After a graph capture: the steps logged before it go to the subscribers, the warm-up's are dropped."""
        if self.log is None:
            return
        self.drain()
        self.log.reset()
        self._owners.clear()
        self._first = 0
        self._rows_since_drain = 0

    # -- reading it ------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Read what was logged since the last drain (one wait for the device) and hand it to the subscribers."""
        self._rows_since_drain = 0
        if self.log is None or not self._owners:
            return
        where = {li: i for i, li in enumerate(self.logged)}
        columns = {id(s): [where[li] for li in self._layers[id(s)]] for s in self.subscribers}
        for number, rows in self.log.drain_numbered():
            index = number - self._first
            if not 0 <= index < len(self._owners):
                continue  # a warm-up step, or one already handed over
            owners = self._owners[index]
            if owners is not None and len(owners) != rows.shape[0]:
                continue  # its first rows were overwritten (counted by the log as lost)
            for subscriber in list(self.subscribers):
                subscriber(rows[:, columns[id(subscriber)]], owners)
        self._first += len(self._owners)
        self._owners.clear()
