"""One `wisp bench serve` run in process: the engine stepped by hand while a load schedule starts requests.

Before each step the driver starts the requests the schedule says are due (`wisp.bench.serve.load`); after it,
each request's new token is timed, and the step's decode tokens are counted: a request's token is a decode
token when it already had output and the step computed exactly one of its tokens (a prefill chunk, or the
re-prefill of a request preempted by recompute, computes more). `widths` counts steps by how many requests
decoded in them (steps that decoded none are left out), so it sums to the decode steps and its tokens
(width x steps) to the decode tokens. When nothing is in flight and an open loop's next arrival is ahead, the
driver sleeps until then.

Not thread-safe (it is the engine's one caller while it runs).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from wisp.bench.serve.load import Load
from wisp.bench.serve.request_times import RequestTimes
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams


@dataclass(frozen=True)
class EngineRun:
    requests: list[RequestTimes]  # in start order
    widths: Counter  # decode width (requests decoded in a step) -> steps
    steps: int  # engine steps, prefill-only ones included
    wall_s: float  # from the first request's start to the last token

    @property
    def decode_steps(self) -> int:
        return sum(self.widths.values())

    @property
    def decode_tokens(self) -> int:
        return sum(width * steps for width, steps in self.widths.items())


def drive_engine(engine: LLMEngine, load: Load, prompts: list[list[int]], params: SamplingParams,
                 clock=time.perf_counter, sleep=time.sleep) -> EngineRun:
    """Run `load` (request i sends prompts[i]) to the end on `engine`, which must hold no request."""
    times: list[RequestTimes] = []
    index: dict[str, int] = {}
    live: dict = {}  # request id -> its Sequence, while it runs
    widths: Counter = Counter()
    steps = 0
    t0 = clock()
    while True:
        now = clock()
        for _ in range(load.due(now - t0, len(times), len(live))):
            rid = f"serve-{len(times)}"
            engine.add_request(rid, prompts[len(times)], params, strict_length=False)
            live[rid], index[rid] = engine.requests[rid], len(times)
            offset = load.scheduled(len(times))
            times.append(RequestTimes(t0 + offset if offset is not None else now))
        if not live:
            upcoming = load.next_start(len(times))
            if upcoming is None:
                break
            sleep(max(0.0, t0 + upcoming - clock()))
            continue
        before = {rid: (seq.num_computed, len(seq.output_ids)) for rid, seq in live.items()}
        outputs = engine.step()
        now, steps = clock(), steps + 1
        width = 0
        for out in outputs:
            seq = live[out.request_id]
            if out.new_token_ids:
                times[index[out.request_id]].token_times.append(now)
                computed, produced = before[out.request_id]
                width += bool(produced) and seq.num_computed - computed == 1
            if out.finished:
                del live[out.request_id]
        if width:
            widths[width] += 1
    end = max((r.token_times[-1] for r in times if r.token_times), default=t0)
    return EngineRun(times, widths, steps, end - t0)


def warm_up(engine: LLMEngine, prompts: list[list[int]], tokens: int = 4) -> None:
    """Kernels and allocator on `prompts` at once (as wide as the widest run; prompts no run sends), then the
    counters start from zero."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"warm-up-{i}", prompt, params, strict_length=False)
    while engine.has_unfinished():
        engine.step()
    engine.reset_stats()
