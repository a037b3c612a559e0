"""wisp.bench.decode's timed decode: one wall time per decode step, in order, that add up to the decode's
time, and their spread (median, 90th percentile, slowest)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from wisp.bench.decode import _timed_decode, step_spread


class FakeEngine:
    """One request whose prefill takes one step and whose decode steps sleep the given seconds each."""

    def __init__(self, decode_sleeps: list[float]):
        self.sleeps, self.requests, self.decode_calls = list(decode_sleeps), {}, 0

    def add_request(self, name, prompt, params, strict_length=False):
        self.requests[name] = SimpleNamespace(first_token_time=None, output_ids=[1])

    def step(self):
        seq = next(iter(self.requests.values()))
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
            return
        time.sleep(self.sleeps.pop(0))
        seq.output_ids.append(1)
        self.decode_calls += 1

    def has_unfinished(self):
        return bool(self.sleeps)


def test_each_decode_step_is_timed_once_and_the_steps_add_up_to_the_decode():
    sleeps = [0.002, 0.03, 0.002, 0.002]
    engine = FakeEngine(sleeps)
    llm = SimpleNamespace(engine=engine, stats=lambda: {})
    timed = _timed_decode(llm, [[1, 2, 3]], None, None)
    assert len(timed.step_s) == engine.decode_calls == timed.decode_steps(1) == 4
    assert sum(timed.step_s) == pytest.approx(timed.t_end - timed.t_first, abs=1e-9)
    assert max(timed.step_s) == timed.step_s[1] >= 0.03 and all(s >= 0.002 for s in timed.step_s)
    assert all(s < 0.025 for i, s in enumerate(timed.step_s) if i != 1)  # one step's time, not a running total


def test_the_spread_is_the_median_the_90th_percentile_and_the_slowest():
    steps = tuple(float(s) for s in [5, 1, 3, 2, 4, 9, 6, 8, 7, 10, 20])
    assert step_spread(steps) == {"step_s_median": 6.0, "step_s_p90": 10.0, "step_s_max": 20.0}
    assert step_spread(()) == {}
