"""Agent sessions as token-id workloads for the replay benchmark (`wisp bench agent`).

A `Session` is one agent conversation; each `Turn` is one request as an agent framework sends it: the
WHOLE conversation so far (frameworks resend it every turn) and how long the reply should be.

Sources, told apart by content (.json: one list; anything else: JSON lines):
- AgentInstruct ({"id", "conversations": [{"role", "content"} or {"from": human/gpt/system, "value"}]}):
  every assistant message is a turn. Its prompt is every message before it, then the assistant's header,
  each message rendered in this fixed format (role: system, user, assistant; another role keeps its name):
      header "<|{role}|>\\n", then body "{text}\\n"
  Headers and bodies are tokenized one at a time and concatenated, so BPE merges never cross them: turn
  k's prompt ids start exactly with turn k-1's (then its reply, the next user message...), as a prefix
  cache would see a framework's requests. reply_tokens: the dataset reply's body, in tokens, capped. The
  next prompt carries the dataset's reply, not the one the model generated in the replay.
  workflow: <w> of the file name agentinstruct_<w>_... (os, db, webshop, kg, alfworld, mind2web), else its stem.
- the agentinfer request log (token counts only, no text): one session per (session_id, actor_id), its
  requests with input_tokens >= 1 in start order. SYNTHETIC TEXT, REAL COUNTS: a turn's prompt is the first
  input_tokens ids of one pseudo-random id stream per session (seeded from sha256 of the session key), so
  turns share prefixes as in the real run (a prompt shorter than the one before, e.g. after the agent
  compacted its context, is then wholly shared); reply_tokens: output_tokens, capped. workflow: "agentinfer".

Invariants: every id is in [0, vocab_size) (a tokenizer producing another raises WispError); reply_tokens
is in [1, max_reply_tokens]; the first turn whose prompt exceeds max_prompt_tokens ends its session (the
turns before it stay; a session left without turns is dropped); bad input raises WispError.

Tool sessions (`tools=True`, `wisp bench agent --tools`): each AgentInstruct conversation is first rendered as
`wisp.bench.agent_tools.tool_messages` says (a system message with the workflow's tools first, actions as hermes
`<tool_call>` blocks, observations as "tool" messages), then tokenized as above; the turns are the same assistant
messages. The agentinfer log has no text to render: with tools it is a WispError.

Tokenizers: any object whose encode(text) gives ids or an object with .ids (a `tokenizers.Tokenizer` is
called with add_special_tokens=False: a BOS per message would sit mid-prompt), e.g. a checkpoint's
tokenizer.json, or `train_session_tokenizer`'s byte-level BPE trained on the sessions' own text.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wisp.bench.agent_tools import tool_messages
from wisp.errors import WispError
from wisp.trace.kv_trace import read_json_records

MAX_TRAINED_VOCAB = 32_000  # the trained BPE's ceiling (merges of pairs seen twice run out near 13k on all files)
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}  # AgentInstruct "from" -> role
END_OF_TEXT = "<|endoftext|>"  # the trained BPE's one special token with tools: where a forced call ends


@dataclass(frozen=True)
class Turn:
    prompt_ids: tuple[int, ...]  # the WHOLE conversation so far, as an agent framework resends it
    reply_tokens: int  # the dataset's own assistant reply length in tokens, capped


@dataclass(frozen=True)
class Session:
    name: str  # "<file stem>/<id>" (AgentInstruct) or "<session_id>/<actor_id>" (agentinfer)
    workflow: str
    turns: tuple[Turn, ...]


def load_sessions(paths: Iterable[str | Path] | str | Path, tokenizer: Any, max_reply_tokens: int,
                  max_prompt_tokens: int | None, vocab_size: int, tools: bool = False) -> list[Session]:
    """Every session of every file, files in the order given (tokenizer may be None for agentinfer logs); `tools`:
    AgentInstruct conversations rendered as tool sessions."""
    if vocab_size < 1 or max_reply_tokens < 1 or (max_prompt_tokens is not None and max_prompt_tokens < 1):
        raise WispError(f"agent sessions need vocab_size, max_reply_tokens and max_prompt_tokens >= 1 "
                        f"(got {vocab_size}, {max_reply_tokens}, {max_prompt_tokens})")
    files, limits = _files(paths), (max_reply_tokens, max_prompt_tokens)
    sessions: list[Session] = []
    for path, records in files:
        try:
            if "conversations" in records[0]:
                if tokenizer is None:
                    raise WispError(f"{path} holds AgentInstruct text: it needs a tokenizer")
                sessions += _instruct_sessions(path, records, _encoder(tokenizer, vocab_size), *limits, tools)
            elif tools:
                raise WispError(f"{path} holds token counts only: tool sessions are rendered from AgentInstruct text")
            else:
                sessions += _agentinfer_sessions(records, vocab_size, *limits)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WispError(f"{path}: unexpected record layout ({exc.__class__.__name__}: {exc})") from None
    if not sessions:
        raise WispError(f"no session with a turn in {', '.join(str(p) for p, _ in files)} "
                        f"(max_prompt_tokens={max_prompt_tokens} below every first prompt?)")
    return sessions


def train_session_tokenizer(paths: Iterable[str | Path] | str | Path, vocab_size: int, tools: bool = False):
    """A byte-level BPE (`tokenizers.Tokenizer`) trained on the AgentInstruct files' rendered messages (as tool
    sessions with `tools`), with at most min(vocab_size, MAX_TRAINED_VOCAB) ids (vocab_size: the model's). Same
    files -> same vocabulary. With `tools` it also holds END_OF_TEXT, a special token (id 0) a forced call ends with."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    size = min(vocab_size, MAX_TRAINED_VOCAB)
    if size < 256:
        raise WispError(f"a byte-level BPE needs at least 256 ids, the model has {vocab_size}: "
                        "pass the checkpoint's tokenizer or use an agentinfer trace")
    texts = [piece for path, records in _files(paths) if "conversations" in records[0]
             for rec in records for piece in _pieces(_messages(rec["conversations"], _workflow(path), tools))]
    if not texts:
        raise WispError("no text to train a tokenizer on: agentinfer traces hold token counts only")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=size, min_frequency=2, show_progress=False, special_tokens=[END_OF_TEXT] if tools else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.get_vocab_size() <= size, (tok.get_vocab_size(), size)
    return tok


# -- AgentInstruct ---------------------------------------------------------------------------------
def _workflow(path: Path) -> str:
    match = re.match(r"agentinstruct_([^_]+)_", path.name)
    return match.group(1) if match else path.stem


def _messages(conversation: list[dict], workflow: str, tools: bool) -> list[tuple[str, str]]:
    """(role, text) per message, as a tool session with `tools`."""
    messages = [(m.get("role") or ROLES.get(m.get("from"), m.get("from")),
                 (m.get("content") if "content" in m else m.get("value")) or "") for m in conversation]
    return tool_messages(workflow, messages) if tools else messages


def _pieces(messages: list[tuple[str, str]]) -> Iterator[str]:
    """Each message's header, then its body, in the fixed format (the units tokenized one at a time)."""
    for role, text in messages:
        yield f"<|{role}|>\n"
        yield f"{text}\n"


def _instruct_sessions(path: Path, records: list[dict], encode: Callable[[str], list[int]],
                       max_reply: int, max_prompt: int | None, tools: bool) -> list[Session]:
    workflow = _workflow(path)
    sessions = []
    for i, rec in enumerate(records):
        prompt: list[int] = []
        turns = []
        pieces = _pieces(_messages(rec["conversations"], workflow, tools))
        for header in pieces:
            head, body = encode(header), encode(next(pieces))
            if header == "<|assistant|>\n":
                if max_prompt is not None and len(prompt) + len(head) > max_prompt:
                    break
                turns.append(Turn(tuple(prompt + head), min(max(1, len(body)), max_reply)))
            prompt += head + body
        if turns:
            sessions.append(Session(f"{path.stem}/{rec.get('id', i)}", workflow, tuple(turns)))
    return sessions


def _encoder(tokenizer: Any, vocab_size: int) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    hf = isinstance(tokenizer, Tokenizer)  # no special tokens per message: a BOS would sit mid-prompt

    def encode(text: str) -> list[int]:
        out = tokenizer.encode(text, add_special_tokens=False) if hf else tokenizer.encode(text)
        ids = list(getattr(out, "ids", out))
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise WispError(f"the tokenizer gave id {max(ids) if max(ids) >= vocab_size else min(ids)}, "
                            f"outside the model's vocabulary [0, {vocab_size}): it is not this model's tokenizer")
        return ids

    return encode


# -- agentinfer -------------------------------------------------------------------------------------
def _agentinfer_sessions(records: list[dict], vocab_size: int, max_reply: int,
                         max_prompt: int | None) -> list[Session]:
    requests: dict[str, list[dict]] = {}  # session key -> requests in start order (dicts keep first-start order)
    for rec in sorted(records, key=lambda r: r.get("started_at") or ""):
        if (rec["input_tokens"] or 0) >= 1:
            requests.setdefault(f"{rec['session_id']}/{rec['actor_id']}", []).append(rec)
    sessions = []
    for key, recs in requests.items():
        counts = []  # (prompt tokens, reply tokens) per kept turn
        for rec in recs:
            if max_prompt is not None and int(rec["input_tokens"]) > max_prompt:
                break
            counts.append((int(rec["input_tokens"]), min(max(1, int(rec.get("output_tokens") or 0)), max_reply)))
        if counts:
            stream = _id_stream(key, max(n for n, _ in counts), vocab_size)
            sessions.append(Session(key, "agentinfer", tuple(Turn(stream[:n], reply) for n, reply in counts)))
    return sessions


def _id_stream(key: str, length: int, vocab_size: int) -> tuple[int, ...]:
    """`length` pseudo-random ids in [0, vocab_size), the same for the same key on every machine."""
    rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
    return tuple(rng.choices(range(vocab_size), k=length))


# -- files ------------------------------------------------------------------------------------------
def _files(paths: Iterable[str | Path] | str | Path) -> list[tuple[Path, list[dict]]]:
    """(path, records) per file: a non-empty list of dicts in a known layout, or WispError."""
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if not paths:
        raise WispError("no agent-session files given")
    return [(path, _records(path)) for path in paths]


def _records(path: Path) -> list[dict]:
    records = read_json_records(path, "agent-session file")
    if not isinstance(records, list) or not records:
        raise WispError(f"agent-session file {path} holds no sessions (expected a non-empty list of records)")
    first = records[0]
    if not isinstance(first, dict) or not ("conversations" in first or "input_tokens" in first):
        keys = sorted(first)[:6] if isinstance(first, dict) else type(first).__name__
        raise WispError(f"agent-session file {path}: unknown format (first record {keys}); expected AgentInstruct "
                        "records {id, conversations} or agentinfer requests {session_id, actor_id, input_tokens}")
    return records
