"""The touch order of one pager step: which of a step's experts count as the most recently used.

A step (a decode token, a decode batch, a prefill chunk) routes T tokens to K experts each. Its distinct
experts are touched token by token, in the step's token order, a token's experts in ascending id; an
expert's recency is its LAST token. Sorting a step's distinct experts by (last token, id) gives its touch
order, least recent first. One token's step is therefore its experts in ascending id, and after a wide
step (more distinct experts than the C slots) the experts that stay are those its last tokens used,
which the next decode steps are most likely to route to again.

The rule never depends on C, so LRU with it stays a stack algorithm and `wisp.plan.miss_curves`'s miss
curves are exact at every capacity. The same rule is written three times, each checked against this
one by tests: here (plain Python, for traces and models), in `wisp.core.experts.stores` (from one device read
of each expert's last token) and in `wisp.core.experts.device_pager` (inside the graph-safe Triton decision).

A flat sequence of ids is a list of references in order: `distinct_in_order` keeps each id's last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
