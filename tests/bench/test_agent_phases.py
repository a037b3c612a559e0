"""The phased workload of `wisp bench agent`: parsing, the sessions the phases take (repeats made distinct) and the
driver's order: phase after phase, never more sessions in flight than the phase's width, each session's turns in
order, every turn once."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.bench.agent_phases import Phase, parse_phases, repeat, serve_phases, sessions_for_phases
from wisp.bench.agent_sessions import Session, Turn
from wisp.engine.block_pool import chain_hash
from wisp.errors import WispError


def _sessions(turns: list[int]) -> list[Session]:
    return [Session(f"s{i}", "w", tuple(Turn(tuple(range(i, i + 20 + 5 * k)), 3) for k in range(n)))
            for i, n in enumerate(turns)]


class FakeEngine:
    """Finishes each request after a random number of steps; records what was in flight at every step."""

    def __init__(self, seed: int):
        self.rng, self.requests, self.left, self.clock = random.Random(seed), {}, {}, 0.0
        self.in_flight: list[set[str]] = []

    def add_request(self, rid, prompt, params, strict_length=True):
        self.requests[rid] = SimpleNamespace(arrival_time=self.clock, first_token_time=None, finish_time=None,
                                             output_ids=[])
        self.left[rid] = self.rng.randint(1, 4)

    def has_unfinished(self) -> bool:
        return bool(self.left)

    def step(self):
        self.clock += 1.0
        self.in_flight.append(set(self.left))
        outs = []
        for rid in list(self.left):
            seq = self.requests[rid]
            seq.output_ids.append(1)
            seq.first_token_time = seq.first_token_time or self.clock
            self.left[rid] -= 1
            if not self.left[rid]:
                del self.left[rid]
                seq.finish_time = self.clock
                outs.append(SimpleNamespace(request_id=rid, finished=True))
        return outs


@settings(max_examples=100, deadline=None)
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_phases_run_one_after_another_within_their_width(data, seed):
    phases = [Phase(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5)))
              for _ in range(data.draw(st.integers(1, 4)))]
    sessions = _sessions(data.draw(st.lists(st.integers(1, 4), min_size=sum(p.sessions for p in phases),
                                            max_size=sum(p.sessions for p in phases))))
    engine = FakeEngine(seed)
    times, marks = serve_phases(engine, sessions, phases, None, 8, mark=lambda: {"steps": len(engine.in_flight)})
    assert len(marks) == len(phases) + 1
    assert sorted((t.session, t.turn) for t in times) == [(s, k) for s, q in enumerate(sessions)
                                                          for k in range(len(q.turns))]
    first = 0
    for p, (phase, a, b) in enumerate(zip(phases, marks, marks[1:])):
        mine = {f"s{s}t{k}" for s in range(first, first + phase.sessions) for k in range(len(sessions[s].turns))}
        steps = engine.in_flight[a["steps"] : b["steps"]]
        assert all(flight <= mine for flight in steps)  # nothing of another phase runs during this one
        assert all(len({r.split("t")[0] for r in flight}) <= phase.width for flight in steps)
        assert {t.phase for t in times if t.session in range(first, first + phase.sessions)} == {p}
        first += phase.sessions
    for s in range(len(sessions)):  # turn k+1 is sent only once turn k is done
        turns = sorted((t for t in times if t.session == s), key=lambda t: t.turn)
        assert all(x.finish <= y.arrival for x, y in zip(turns, turns[1:]))


def test_phases_parse_and_bad_ones_are_refused():
    assert parse_phases("1:2, 8:8,2:4") == [Phase(1, 2), Phase(8, 8), Phase(2, 4)]
    for bad in ["", "1", "0:2", "2:0", "a:b", "1:2,3"]:
        with pytest.raises(WispError):
            parse_phases(bad)


def test_repeats_keep_lengths_and_share_no_block_with_the_first_pass():
    sessions = _sessions([3, 2])
    phased = sessions_for_phases(sessions, [Phase(1, 3), Phase(2, 2)], vocab_size=250)
    assert [s.name for s in phased] == ["s0", "s1", "s0#1", "s1#1", "s0#2"]
    for s in phased[2:]:
        base = sessions[int(s.name[1])]
        assert [len(t.prompt_ids) for t in s.turns] == [len(t.prompt_ids) for t in base.turns]
        assert [t.reply_tokens for t in s.turns] == [t.reply_tokens for t in base.turns]
        # a block's cache key chains every id before it: no block of a repeat is a block of the first pass
        assert chain_hash(None, list(s.turns[0].prompt_ids[:16])) != chain_hash(None, list(base.turns[0].prompt_ids[:16]))
        assert all(t.prompt_ids[1:] == u.prompt_ids[1:] for t, u in zip(s.turns, base.turns))
        assert len({t.prompt_ids[0] for t in s.turns}) == 1  # one session: its turns still share their prefix
    assert repeat(sessions[0], 0, 250) is sessions[0]
