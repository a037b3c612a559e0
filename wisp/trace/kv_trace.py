"""KV traces: a workload as the prefix-cache sees it, one entry per request, in arrival order.

A request is the list of keys of its prompt's full blocks (`kv_miss_curve`'s input). Two requests share
a block exactly when they share the prompt prefix up to that block's end, so a key is the pair
(conversation, block index) and a later turn of a conversation re-references its earlier blocks.

Sources (all reduced to prompt/output token counts per conversation turn):
- our JSONL: one object per request {"session": str, "prompt_tokens": int, "output_tokens": int};
- AgentInstruct sessions (../shared/data/agent_sessions/agentinstruct_*): every assistant message is a
  request whose prompt is the conversation before it; tokens estimated as characters / chars_per_token;
- the agentinfer request log: per (session_id, actor_id), requests in start order with input_tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from wisp.errors import WispError


@dataclass
class KVTrace:
    block_size: int
    requests: list[list[int]] = field(default_factory=list)  # block keys per request
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)

    def add(self, session: str, prompt_tokens: int, output_tokens: int) -> None:
        self.requests.append([hash((session, i)) for i in range(prompt_tokens // self.block_size)])
        self.prompt_tokens.append(prompt_tokens)
        self.output_tokens.append(output_tokens)

    @property
    def max_blocks(self) -> int:
        return max((len(r) for r in self.requests), default=0)


def _turns_from_messages(messages: list[dict], chars_per_token: float) -> list[tuple[int, int]]:
    turns, seen = [], 0
    for m in messages:
        role = m.get("role") or {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("from"))
        text = m.get("content") if "content" in m else m.get("value", "")
        n = max(1, round(len(text or "") / chars_per_token))
        if role == "assistant":
            turns.append((seen, n))
        seen += n
    return turns


def read_json_records(path: Path, what: str):
    """A .json file's value, or any other file's JSON lines as a list; WispError (naming `what`) when the
    file is absent or not valid JSON."""
    if not path.is_file():
        raise WispError(f"{what} {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise WispError(f"{what} {path} is not valid JSON/JSONL: {exc}") from None


def read_kv_trace(path: str | Path, block_size: int = 16, chars_per_token: float = 4.0) -> KVTrace:
    """Any supported KV source, by content."""
    path = Path(path)
    trace = KVTrace(block_size)
    records = read_json_records(path, "KV trace")
    if not records:
        raise WispError(f"KV trace {path} is empty")
    try:
        _add_records(trace, records, chars_per_token)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WispError(f"KV trace {path}: unexpected record layout ({exc.__class__.__name__}: {exc})") from None
    return trace


def _add_records(trace: KVTrace, records, chars_per_token: float) -> None:
    if not isinstance(records, list):
        raise TypeError("expected a list of records")
    first = records[0]
    if "conversations" in first:
        for i, rec in enumerate(records):
            sid = str(rec.get("id", i))
            for prompt, out in _turns_from_messages(rec["conversations"], chars_per_token):
                trace.add(sid, prompt, out)
    elif "input_tokens" in first:
        ordered = sorted((r for r in records if r.get("input_tokens") is not None), key=lambda r: r.get("started_at") or "")
        for rec in ordered:
            trace.add(f"{rec.get('session_id')}/{rec.get('actor_id')}", int(rec["input_tokens"]), int(rec.get("output_tokens") or 0))
    elif "prompt_tokens" in first:
        for rec in records:
            trace.add(str(rec.get("session", "")), int(rec["prompt_tokens"]), int(rec.get("output_tokens", 0)))
    else:
        raise ValueError(f"unknown record layout (keys {sorted(first)[:6]})")
