"""The load of one `wisp bench serve` run: when its requests start, and their prompts.

Two schedules, asked the same question by both drivers (in process and over HTTP): how many more requests
start now, `due(elapsed, started, in_flight)`, and when the next one would start were nothing to finish first,
`next_start(started)`.
- `ClosedLoop(W, N)`: W requests in flight at all times; each new one starts when one finishes, until N
  have started. Invariant: `in_flight + due(...) <= W` and `started + due(...) <= N`.
- `OpenLoop(R, N, seed)`: N Poisson arrivals at R requests a second (exponential gaps drawn from `seed`), the
  first at 0; whatever is in flight. Invariant: its arrival times are non-decreasing, the same for the same
  seed, and `due` starts exactly the requests whose arrival time has passed.

Prompts are random token ids (`random_prompts`), distinct per request and per run, so no request's prompt is
served from the prefix cache another one left.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int  # W: requests in flight at all times (while any are left to start)
    num_requests: int

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.num_requests < 1:
            raise ValueError(f"a closed loop needs W >= 1 and N >= 1, got W={self.concurrency} N={self.num_requests}")

    @property
    def label(self) -> dict:
        return {"loop": "closed", "concurrency": self.concurrency, "request_rate": None}

    def due(self, elapsed: float, started: int, in_flight: int) -> int:
        return max(0, min(self.concurrency - in_flight, self.num_requests - started))

    def next_start(self, started: int) -> float | None:
        """None: a closed loop's next request waits for one in flight to finish."""
        return None

    def scheduled(self, index: int) -> float | None:
        """None: a closed loop's request starts when it is sent."""
        return None


@dataclass(frozen=True)
class OpenLoop:
    rate: float  # R: requests a second, on average
    num_requests: int
    seed: int = 0
    arrivals: tuple[float, ...] = field(init=False)  # seconds after the run's start, non-decreasing

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.num_requests < 1:
            raise ValueError(f"an open loop needs R > 0 and N >= 1, got R={self.rate} N={self.num_requests}")
        gaps = np.random.default_rng(self.seed).exponential(1 / self.rate, self.num_requests - 1)
        object.__setattr__(self, "arrivals", (0.0, *np.cumsum(gaps).tolist()))

    @property
    def label(self) -> dict:
        return {"loop": "open", "concurrency": None, "request_rate": self.rate}

    def due(self, elapsed: float, started: int, in_flight: int) -> int:
        return bisect.bisect_right(self.arrivals, elapsed) - started

    def next_start(self, started: int) -> float | None:
        return self.arrivals[started] if started < self.num_requests else None

    def scheduled(self, index: int) -> float | None:
        """When request `index` arrives (its times are measured from then, not from when a step let it in)."""
        return self.arrivals[index]


Load = ClosedLoop | OpenLoop


def random_prompts(vocab_size: int, prompt_len: int, count: int, seed: int, run: int) -> list[list[int]]:
    """`count` prompts of `prompt_len` random token ids, drawn from (seed, run): distinct per request and run."""
    rng = np.random.default_rng([seed, run])
    return rng.integers(0, vocab_size, (count, prompt_len)).tolist()
