"""Agent-session workloads as `controller_sim` request streams: KV traces for the KV side, a routing
trace for the expert side.

Workflows (os, db, webshop, ... as `wisp.trace.kv_trace.KVTrace`s) run back to back in the order given,
so a list of several is a drifting workload. Per request:
- KV: its prompt's full blocks, keyed per workflow (so two workflows never share a block), and their
  stack distances over the whole stream (`kv_stack_distances`);
- tokens computed: its output tokens plus the prompt tokens an unbounded prefix cache would still compute
  (its first-seen blocks, and the prompt's partial last block), capped at `max_tokens`;
- experts: that many tokens taken in turn from the routing trace (cyclically; every layer of the trace,
  `per_token` steps), and the stack distances of their references per layer over the whole stream.

What this can and cannot say: the KV side is the sessions' own reuse; the expert side is real routing
but not the sessions' own (no trace pairs routing with these prompts), so workflows differ only in KV
reuse and in how many tokens they compute.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wisp.plan.miss_curves import COLD, kv_stack_distances, stack_distances
from wisp.sim.controller_sim import SimRequest
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace


def session_requests(routing: RoutingTrace, workflows: Sequence[tuple[str, KVTrace]], max_tokens: int = 512) -> list[SimRequest]:
    """The request stream of `workflows` run back to back (see the module docstring)."""
    names, keyed, prompts, outputs, block_size = [], [], [], [], None
    for name, kv in workflows:
        block_size = kv.block_size
        for req, p, o in zip(kv.requests, kv.prompt_tokens, kv.output_tokens):
            names.append(name)
            keyed.append([hash((name, k)) for k in req])
            prompts.append(p)
            outputs.append(o)
    kv_d = _chunks(kv_stack_distances(keyed), [len(dict.fromkeys(r)) for r in keyed])
    tokens = [min(max_tokens, o + int(np.count_nonzero(d == COLD)) * block_size + p % block_size)
              for d, p, o in zip(kv_d, prompts, outputs)]
    exp_d = _expert_distances(routing, tokens)
    return [SimRequest(n, t, e, k) for n, t, e, k in zip(names, tokens, exp_d, kv_d)]


def _expert_distances(routing: RoutingTrace, tokens: list[int]) -> list[np.ndarray]:
    """Per request, the stack distances of its tokens' expert references in every layer."""
    total = sum(tokens)
    per_request: list[list[np.ndarray]] = [[] for _ in tokens]
    for layer in routing.layers.tolist():
        d, refs = _cyclic_distances(routing.steps(layer, per_token=True), total)
        start = 0
        for i, n in enumerate(tokens):
            per_request[i].append(d[refs[start] : refs[start + n]])
            start += n
    return [np.concatenate(parts) if parts else np.zeros(0, np.int64) for parts in per_request]


def _cyclic_distances(by_token: list[list[int]], total: int) -> tuple[np.ndarray, np.ndarray]:
    """Stack distances of `total` tokens taken cyclically from `by_token`, and each token's first
    reference index (length total + 1). Computed over at most two periods: from the second period on,
    every reference's distance repeats that of the same token one period earlier (what happened since
    an expert's last use lies within the last period), so later periods are copies."""
    period = len(by_token)
    head = [by_token[t % period] for t in range(min(total, 2 * period))]
    d = stack_distances(head)
    sizes = np.array([len(s) for s in by_token] * -(-total // period), dtype=np.int64)[:total]
    refs = np.concatenate([[0], np.cumsum(sizes)])
    if total > 2 * period:
        first, second = d[: refs[period]], d[refs[period] : refs[2 * period]]
        repeats, rest = divmod(total - period, period)
        d = np.concatenate([first, np.tile(second, repeats), second[: refs[rest] if rest else 0]])
    return d, refs


def _chunks(values: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(values, np.cumsum(sizes)[:-1]) if sizes else []
