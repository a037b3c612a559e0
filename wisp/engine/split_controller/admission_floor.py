"""AdmissionFloor: how many requests the KV pool must be able to admit, following the demand of the recent past.

The engine's fixed admission floor reserves KV for max_concurrency (W) requests of max_model_len (L) tokens at all
times. When the demand (requests running plus waiting, at most W) changes in phases, that reserve is idle
whenever fewer requests are in flight, and those bytes could hold expert slots instead. This class says how many
requests' worth of KV the pool must keep now: the peak demand over the last `window` observations (engine steps),
never below one request. The window keeps the floor from following momentary dips (a turn that ends before the
agent sends the next one leaves one fewer request for a step) while it does follow a sustained fall (a phase's
tail, a quieter phase).

It only counts: `wisp.engine.live_split.LiveSplit` feeds it the demand after every step, raises the controller's
KV floor to it at once (growing the pool before the new requests are admitted) and lets re-solves shrink the pool
only down to it.

Invariants: 1 <= requests <= max_requests; requests is the largest demand (clamped to [1, max_requests]) among
the last `window` observations (1 before any); blocks == requests * request_blocks.
"""

from __future__ import annotations

from collections import deque


class AdmissionFloor:
    def __init__(self, max_requests: int, request_blocks: int, window: int):
        if max_requests < 1 or request_blocks < 1 or window < 1:
            raise ValueError(f"max_requests, request_blocks and window must be >= 1 "
                             f"(got {max_requests}, {request_blocks}, {window})")
        self.max_requests, self.request_blocks, self.window = max_requests, request_blocks, window
        self._seen = 0  # observations so far
        self._peaks: deque[tuple[int, int]] = deque()  # (observation number, demand), demands strictly decreasing

    def observe(self, demand: int) -> None:
        """One step's demand: requests running plus waiting."""
        demand = min(max(demand, 1), self.max_requests)
        self._seen += 1
        while self._peaks and self._peaks[-1][1] <= demand:
            self._peaks.pop()  # a smaller or equal earlier demand can never be the peak again
        self._peaks.append((self._seen, demand))
        while self._peaks[0][0] <= self._seen - self.window:
            self._peaks.popleft()

    @property
    def requests(self) -> int:
        """Requests the pool must be able to admit now."""
        return self._peaks[0][1] if self._peaks else 1

    @property
    def blocks(self) -> int:
        return self.requests * self.request_blocks
