"""The size of an agent-session workload, for documentation: sessions, turns, prompt tokens (in total, and
new: beyond each turn's common prefix with the previous turn of its session, i.e. what a perfect prefix
cache of the prompts still prefills; the model's own replies are not counted as cached), reply tokens.

    python -m wisp.bench.session_stats [--vocab-size N] [--max-reply-tokens N] [--max-prompt-tokens N] FILE...

prints one row per file; AgentInstruct text is tokenized by a byte-level BPE trained on all the given files.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

from wisp.bench.agent_sessions import Session, load_sessions, train_session_tokenizer


@dataclass(frozen=True)
class SessionStats:
    sessions: int
    turns: int
    prompt_tokens: int  # every turn's whole prompt: what a server without a prefix cache prefills
    new_prompt_tokens: int  # beyond the prefix shared with the session's previous prompt
    reply_tokens: int


def session_stats(sessions: Iterable[Session]) -> SessionStats:
    sessions = list(sessions)
    turns = [t for s in sessions for t in s.turns]
    shared = sum(_common_prefix(a.prompt_ids, b.prompt_ids) for s in sessions for a, b in zip(s.turns, s.turns[1:]))
    prompt = sum(len(t.prompt_ids) for t in turns)
    return SessionStats(len(sessions), len(turns), prompt, prompt - shared, sum(t.reply_tokens for t in turns))


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m wisp.bench.session_stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--vocab-size", type=int, default=151_936, help="the model's vocabulary (Qwen3's by default)")
    parser.add_argument("--max-reply-tokens", type=int, default=1 << 30)
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    with_text = any("agentinfer" not in f for f in args.files)  # the trainer skips the agentinfer logs itself
    tok = train_session_tokenizer(args.files, args.vocab_size) if with_text else None
    print(f"{'file':40} {'sessions':>8} {'turns':>6} {'prompt tok':>11} {'new prompt':>11} {'reply tok':>10}")
    for file in args.files:
        s = session_stats(load_sessions([file], tok, args.max_reply_tokens, args.max_prompt_tokens, args.vocab_size))
        name = file.rsplit("/", 1)[-1]
        print(f"{name:40} {s.sessions:8} {s.turns:6} {s.prompt_tokens:11} {s.new_prompt_tokens:11} {s.reply_tokens:10}")


if __name__ == "__main__":
    main()
