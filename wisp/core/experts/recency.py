"""The touch order of one pager step: which of a step's experts count as the most recently used.

A step (a decode token, a decode batch, a prefill chunk) routes T tokens to K experts each. Its distinct
experts are touched token by token, in the step's token order, a token's experts in ascending id; an
expert's recency is its LAST token. Sorting a step's distinct experts by (last token, id) gives its touch
order, least recent first. One token's step is therefore its experts in ascending id, and after a wide
step (more distinct experts than the C slots) the experts that stay are those its last tokens used,
which the next decode steps are most likely to route to again.

The rule never depends on C, so LRU with it stays a stack algorithm and `wisp.plan.miss_curves`'s miss
curves are exact at every capacity. The same rule is written three times, each checked against this
one by tests: here (plain Python, for traces and models), in `wisp.core.experts.recency.routed_counts_and_last_token` (from one device read
of each expert's last token) and in `wisp.core.experts.device_pager` (inside the graph-safe Triton decision).

A flat sequence of ids is a list of references in order: `distinct_in_order` keeps each id's last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def order_by_last_token(last_token: Sequence[int]) -> list[int]:
    """Experts with last_token[e] >= 0 (routed in the step), least recent first: by (last token, id)."""
    return sorted((e for e, t in enumerate(last_token) if t >= 0), key=lambda e: (last_token[e], e))


def touch_order(tokens: Iterable[Iterable[int]]) -> list[int]:
    """A step's distinct experts in touch order from its tokens' routed ids (negative ids: none)."""
    last: dict[int, int] = {}
    for t, experts in enumerate(tokens):
        for e in experts:
            if int(e) >= 0:
                last[int(e)] = t
    return sorted(last, key=lambda e: (last[e], e))


def distinct_in_order(references: Iterable[int]) -> list[int]:
    """Distinct ids of a reference sequence, each at its last reference (least recent first)."""
    return list(reversed(dict.fromkeys(int(e) for e in reversed(list(references)))))


def routed_counts_and_last_token(topk_ids: torch.Tensor, num_experts: int) -> tuple[list[int], list[int]]:
    """Per expert: the pairs of `topk_ids` [T, K] routed to it and the last token that routes to it (-1:
    none), in one host read."""
    ids = topk_ids.reshape(-1).long()
    token = torch.arange(topk_ids.shape[0], device=ids.device).repeat_interleave(topk_ids.shape[1])  # [T*K]
    last = torch.full((num_experts,), -1, dtype=torch.long, device=ids.device).scatter_reduce_(0, ids, token, "amax")
    both = torch.stack([torch.bincount(ids, minlength=num_experts), last]).tolist()
    return both[0], both[1]
