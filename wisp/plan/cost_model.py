"""The plan's cost model: what one miss costs on each side, in seconds.

An expert miss copies one expert host->device: expert_miss_seconds = expert_bytes * seconds_per_byte.
A KV block miss recomputes the block's tokens: kv_miss_seconds = recompute_seconds_per_token *
block_size. The planner prices one request: its expert curve counts misses per token, so a unit of it
costs `expert_seconds_per_request` (expert_miss_seconds * tokens_per_request); its KV curve counts
block misses per request, so a unit of it costs kv_miss_seconds.

Invariants: the two per-miss costs follow from the measured ones (build with `CostModel.of`); a plan
file read back carries them as written.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    seconds_per_byte: float  # host->device copy time per byte
    recompute_seconds_per_token: float  # prefill time per token
    tokens_per_request: int
    expert_miss_seconds: float  # one expert copied in
    kv_miss_seconds: float  # one KV block recomputed

    @classmethod
    def of(cls, seconds_per_byte: float, recompute_seconds_per_token: float, tokens_per_request: int, expert_bytes: int,
           block_size: int) -> "CostModel":
        return cls(seconds_per_byte, recompute_seconds_per_token, tokens_per_request, expert_bytes * seconds_per_byte,
                   recompute_seconds_per_token * block_size)

    @property
    def expert_seconds_per_request(self) -> float:
        """Seconds per request of one expert miss per token."""
        return self.expert_miss_seconds * self.tokens_per_request
