"""When one benchmarked request started and when each of its tokens reached the host.

In process a token's time is taken when the engine step that produced it returns; over HTTP, when the streamed
chunk that carried it arrived (a chunk may carry several tokens: `tokens` then says how many there were).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestTimes:
    start: float  # when it was sent (open loop: when it arrived), perf_counter seconds
    token_times: list[float] = field(default_factory=list)  # non-decreasing
    tokens: int | None = None  # output tokens when they are not one per time (HTTP chunks); None: len(token_times)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times) if self.tokens is None else self.tokens

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.start if self.token_times else None

    @property
    def gaps(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive token (or chunk) times."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]
