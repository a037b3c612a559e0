"""Phased concurrency for `wisp bench agent`: W sessions at once, phase after phase, in one engine.

`--phases 1:2,8:8,2:4` serves the workload's first 2 sessions one at a time, then the next 8 all at once, then
the next 4 two at a time. Within a phase the loop is closed, as in every `wisp bench agent` run: a session sends
turn k+1 (the whole conversation so far) when turn k's reply is done, and a finished session's slot takes the
phase's next session. A phase starts when the one before has finished every turn, so W sessions are in flight
during a phase but for its tail, where the last ones end one by one. Without `--phases` the workload is one
phase: `--concurrency` sessions at once over every session.

Why closed loop and not arrivals at a rate: a closed loop's end-to-end wall is its work over the throughput, so a
faster split shows in it directly; an open loop's wall is set by its arrival times wherever the server keeps up.

Sessions: phases take the workload's sessions in order; when those run out they start again from the first, each
repeat made distinct (`repeat`: its first prompt id shifted by the pass number, modulo the vocabulary). A repeat
keeps the lengths and the turns' shared prefixes, but shares no KV block with an earlier pass, because a block's
cache key chains every id before it.

Tool sessions (`tools`, a `wisp.bench.agent_tool_replay.ToolReplay`): each turn's request carries its workflow's
forced-call grammar, and each finished turn's times carry its finish reason and reply ids (judged after serving, by
`ToolReplay.judge`, so that no decoding or parsing runs between the engine's steps).

Invariants: sessions_for_phases returns exactly sum(phase.sessions) sessions; `serve_phases` serves phase p's
sessions only after phase p-1's last turn finished, never more than phase p's width at once, each session's
turns in order; every turn is served once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from wisp.bench.agent_sessions import Session, Turn
from wisp.bench.percentiles import percentile
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError


@dataclass(frozen=True)
class Phase:
    width: int  # sessions in flight at once (W)
    sessions: int  # sessions the phase serves


@dataclass(frozen=True)
class TurnTimes:
    session: int  # index in the phased session list
    turn: int
    workflow: str
    phase: int
    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    finish_reason: str | None = None  # with tools only, as is output_ids
    output_ids: tuple[int, ...] | None = None  # the reply's ids

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def wall(self) -> float:
        return self.finish - self.arrival

    @property
    def decode_tok_s(self) -> float | None:
        return (self.output_tokens - 1) / (self.finish - self.first_token) if self.output_tokens > 1 else None


def parse_phases(text: str) -> list[Phase]:
    """"W:N,W:N,...": N sessions W at a time per phase, in order."""
    phases = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        width, _, count = part.partition(":")
        try:
            phase = Phase(int(width), int(count))
        except ValueError:
            raise WispError(f"bad phase {part!r}: expected W:N, e.g. 1:2,8:8,2:4") from None
        if phase.width < 1 or phase.sessions < 1:
            raise WispError(f"bad phase {part!r}: W and N must be >= 1")
        phases.append(phase)
    if not phases:
        raise WispError(f"no phase in {text!r}: expected W:N,..., e.g. 1:2,8:8,2:4")
    return phases


def one_phase(width: int, sessions: int) -> list[Phase]:
    """The workload without `--phases`: every session, `width` at once."""
    return [Phase(width, sessions)]


def sessions_for_phases(sessions: list[Session], phases: list[Phase], vocab_size: int) -> list[Session]:
    """The sessions the phases serve, in order: the workload's, again and again as distinct repeats if it is short."""
    need = sum(p.sessions for p in phases)
    return [repeat(sessions[i % len(sessions)], i // len(sessions), vocab_size) for i in range(need)]


def repeat(session: Session, k: int, vocab_size: int) -> Session:
    """Pass k of a session (k = 0: itself): every turn's first prompt id shifted by k modulo the vocabulary."""
    if k == 0:
        return session
    first = (session.turns[0].prompt_ids[0] + k) % vocab_size
    turns = tuple(replace(t, prompt_ids=(first,) + t.prompt_ids[1:]) for t in session.turns)
    return Session(f"{session.name}#{k}", session.workflow, turns)


def summarize(times: list[TurnTimes]) -> dict:
    """Timing fields of some turns: TTFT and turn wall percentiles, per-stream decode speed (median)."""
    ttft, wall = [t.ttft for t in times], [t.wall for t in times]
    rates = [r for r in (t.decode_tok_s for t in times) if r is not None]
    return {"ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "decode_tok_s": percentile(rates, 50), "turn_wall_p50_s": percentile(wall, 50),
            "turn_wall_p90_s": percentile(wall, 90), "turns": len(times)}


def serve_phases(engine, sessions: list[Session], phases: list[Phase], replay, max_reply: int,
                 mark: Callable[[], dict] | None = None, tools=None) -> tuple[list[TurnTimes], list[dict]]:
    """Serve `sessions` phase after phase (see the module docstring). `replay` (a `SessionRoutingReplay`, or None)
    routes session s from offset s x (its length // sessions); `tools` (a `ToolReplay`, or None) forces tool calls.
    Returns every turn's times and `mark()` taken before the first phase and after each (none without `mark`)."""
    done: list[TurnTimes] = []
    marks = [mark()] if mark is not None else []
    stride = len(replay) // max(len(sessions), 1) if replay is not None else 0
    first = 0
    for p, phase in enumerate(phases):
        group = range(first, first + phase.sessions)
        done += _serve_phase(engine, sessions, group, phase.width, p, replay, stride, max_reply, tools)
        first += phase.sessions
        if mark is not None:
            marks.append(mark())
    return done, marks


def _serve_phase(engine, sessions: list[Session], group: range, width: int, phase: int, replay, stride: int,
                 max_reply: int, tools) -> list[TurnTimes]:
    queue, live, done = deque(group), {}, []

    def submit(s: int, k: int) -> None:
        turn: Turn = sessions[s].turns[k]
        rid = f"s{s}t{k}"
        params = SamplingParams(max_tokens=min(turn.reply_tokens, max_reply), ignore_eos=True)
        grammar = {} if tools is None else {"constraint": tools.constraint(sessions[s].workflow)}
        engine.add_request(rid, list(turn.prompt_ids), params, strict_length=False, **grammar)
        if replay is not None:
            replay.assign(rid, s * stride)
        live[rid] = (s, k, engine.requests[rid])

    for _ in range(width):
        if queue:
            submit(queue.popleft(), 0)
    while engine.has_unfinished():
        for out in engine.step():
            if not out.finished:
                continue
            s, k, seq = live.pop(out.request_id)
            if replay is not None:
                replay.forget(out.request_id)
            reply = {} if tools is None else {"finish_reason": out.finish_reason, "output_ids": tuple(seq.output_ids)}
            done.append(TurnTimes(s, k, sessions[s].workflow, phase, seq.arrival_time, seq.first_token_time,
                                  seq.finish_time, len(seq.output_ids), **reply))
            if k + 1 < len(sessions[s].turns):
                submit(s, k + 1)
            elif queue:
                submit(queue.popleft(), 0)
    return done
