"""Forced tool calls in `wisp bench agent --tools`: every replayed turn's reply is one valid call to its workflow's
tools (arguments checked with jsonschema) or was cut at its max_tokens; the verdicts; the demo model in the engine,
in process and through the command line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from tests.cli_runner import run_wisp
from wisp.bench.agent_phases import one_phase, serve_phases
from wisp.bench.agent_sessions import END_OF_TEXT, load_sessions, train_session_tokenizer
from wisp.bench.agent_tool_replay import ToolGrammarSource, ToolReplay, call_counts
from wisp.bench.agent_tools import call_block, workflow_tools
from wisp.server.tool_calls import HermesFormat

MODEL_VOCAB, TRAINED_VOCAB = 600, 400  # the model's rows past the trained BPE's must never be chosen
OS = [("user", "How many files are in /etc?"),
      ("assistant", "Think: count.\n\nAct: bash\n\n```bash\nls /etc | wc -l\n```"),
      ("user", "The output of the OS:\n213"), ("assistant", "Think: done.\n\nAct: answer(213)"),
      ("user", "ok"), ("assistant", "Act: finish")]
DB = [("user", "How many drivers?"), ("assistant", "Ok."), ("user", "Table drivers."),
      ("assistant", "Count.\nAction: Operation\n```sql\nSELECT COUNT(*) FROM drivers;\n```"), ("user", "[(7,)]"),
      ("assistant", 'There are 7.\nAction: Answer\nFinal Answer: ["7"]')]
KG = [("user", "Who designed it?"), ("assistant", "Thought: look.\nAction: get_relations(Kerosene)"),
      ("user", "Observation: [a, b]"), ("assistant", "Final Answer: #0")]


def write_files(folder: Path, copies: int = 1) -> list[Path]:
    files = []
    for workflow, messages in [("os", OS), ("db", DB), ("kg", KG)]:
        path = folder / f"agentinstruct_{workflow}_t.json"
        path.write_text(json.dumps([{"id": f"{workflow}{i}", "conversations": [{"role": r, "content": t}
                                                                               for r, t in messages]}
                                    for i in range(copies)]))
        files.append(path)
    return files


def assert_valid_or_cut(workflow: str, text: str, finish_reason: str, verdict: str) -> bool:
    """The reply is one call to the workflow's tools with schema-valid arguments, or was cut at max_tokens having
    written only the start of one; True for a whole call."""
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in workflow_tools(workflow)}
    parsed = HermesFormat().parse(text)
    if len(parsed.tool_calls) == 1 and parsed.content is None and parsed.tool_calls[0].name in tools:
        call = parsed.tool_calls[0]
        jsonschema.validate(json.loads(call.arguments), tools[call.name])
        assert verdict == "complete"
        return True
    assert finish_reason == "length" and verdict == "cut", (finish_reason, verdict, text)
    head = '<tool_call>\n{"name": "'
    assert text.startswith(head) or head.startswith(text), text  # the grammar held it from the first token
    return False


class UniformEngine:
    """The engine's request contract, sampling uniformly among the tokens the request's grammar allows (a model
    with no preference), and stopping as the engine does: the grammar finished ("stop") or max_tokens ("length")."""

    def __init__(self, vocab_size: int, seed: int):
        self.vocab, self.rng, self.requests, self.live, self.clock = vocab_size, random.Random(seed), {}, [], 0.0

    def add_request(self, rid, prompt, params, strict_length=True, constraint=None):
        assert constraint is not None
        self.requests[rid] = SimpleNamespace(arrival_time=self.clock, first_token_time=None, finish_time=None,
                                             output_ids=[], params=params, constraint=constraint)
        self.live.append(rid)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self):
        self.clock += 1.0
        outs = []
        for rid in list(self.live):
            seq = self.requests[rid]
            logits = torch.zeros(self.vocab)
            seq.constraint.mask(logits)
            allowed = torch.isfinite(logits).nonzero().flatten().tolist()
            token = self.rng.choice(allowed)
            seq.constraint.accept(token)
            seq.output_ids.append(token)
            seq.first_token_time = seq.first_token_time or self.clock
            full = len(seq.output_ids) >= seq.params.max_tokens
            reason = "stop" if seq.constraint.finished else "length" if full else None
            if reason:
                self.live.remove(rid)
                seq.finish_time = self.clock
                outs.append(SimpleNamespace(request_id=rid, finished=True, finish_reason=reason))
        return outs


def test_forced_replies_through_the_driver_are_valid_calls_or_cut(tmp_path):
    files = write_files(tmp_path, copies=6)
    tok = train_session_tokenizer(files, TRAINED_VOCAB, tools=True)
    sessions = load_sessions(files, tok, 120, None, MODEL_VOCAB, tools=True)
    replay = ToolReplay(ToolGrammarSource(tok.to_str(), (tok.token_to_id(END_OF_TEXT),), MODEL_VOCAB),
                        [s.workflow for s in sessions])
    engine = UniformEngine(MODEL_VOCAB, seed=3)
    times, _ = serve_phases(engine, sessions, one_phase(4, len(sessions)), None, 120, tools=replay)
    assert len(times) == sum(len(s.turns) for s in sessions) and replay.mask_s > 0
    whole = {}
    for t in times:
        assert t.output_ids and max(t.output_ids) < tok.get_vocab_size()  # never a padded row
        text, verdict = replay.judge(t.workflow, list(t.output_ids), t.finish_reason)
        if assert_valid_or_cut(t.workflow, text, t.finish_reason, verdict):
            whole[t.workflow] = whole.get(t.workflow, 0) + 1
    assert "os" in whole and sum(whole.values()) >= 3  # with no preference strings end, and finish() takes no argument


def test_verdicts(tmp_path):
    tok = train_session_tokenizer(write_files(tmp_path), MODEL_VOCAB, tools=True)
    end = tok.token_to_id(END_OF_TEXT)
    replay = ToolReplay(ToolGrammarSource(tok.to_str(), (end,), MODEL_VOCAB), ["os"])

    def verdict(text: str, reason: str, workflow: str = "os") -> str:
        ids = tok.encode(text, add_special_tokens=False).ids + ([end] if reason == "stop" else [])
        judged, v = replay.judge(workflow, ids, reason)
        assert judged == text  # the end id is not part of the text
        return v

    finish = call_block("finish", {})
    assert verdict(finish, "stop") == verdict(finish, "length") == "complete"
    assert verdict(finish[:-len("</tool_call>")], "length") == "complete"  # unclosed, its JSON whole: a call
    assert verdict(finish[:-3], "length") == "cut"  # a torn closing tag is not JSON
    assert verdict(finish[:20], "length") == "cut" and verdict(finish[:20], "stop") == "other"
    assert verdict("Think.\n" + finish, "stop") == "other"  # content beside the call
    assert verdict(call_block("act", {"action": "x"}), "stop") == "other"  # not one of os's tools
    assert verdict(call_block("act", {"action": "x"}), "stop", "kg") == "complete"
    assert verdict(finish + "\n" + finish, "stop") == "other"  # one call only
    assert call_counts(["cut", "complete", "cut"]) == {"complete": 1, "cut": 2, "other": 0}


@pytest.mark.slow
def test_the_demo_model_writes_only_forced_calls(tmp_path):
    """The engine holds each reply to its grammar: every reply is a valid call or a cut start of one, and a fresh
    grammar of its workflow takes each reply's tokens."""
    from tokenizers import Tokenizer

    from wisp.config import EngineConfig
    from wisp.engine.engine import LLMEngine
    from wisp.models.demo import demo_path

    torch.manual_seed(0)
    tokenizer_file = demo_path() / "tokenizer.json"
    sessions = load_sessions(write_files(tmp_path), Tokenizer.from_file(str(tokenizer_file)), 24, 1900, 259, tools=True)
    engine = LLMEngine(EngineConfig(model="demo", device="cpu", max_concurrency=3, max_model_len=2048))
    replay = ToolReplay(ToolGrammarSource(tokenizer_file.read_text(), (256,), 259), [s.workflow for s in sessions])
    times, _ = serve_phases(engine, sessions, one_phase(3, len(sessions)), None, 24, tools=replay)
    assert len(times) == sum(len(s.turns) for s in sessions) == 8
    for t in times:
        assert t.finish_reason in ("stop", "length")
        text, verdict = replay.judge(t.workflow, list(t.output_ids), t.finish_reason)
        assert_valid_or_cut(t.workflow, text, t.finish_reason, verdict)
        fresh = replay.constraint(t.workflow)
        for token in t.output_ids:
            fresh.accept(token)  # raises on a token the grammar refuses


@pytest.mark.slow
def test_bench_agent_tools_records_the_calls(tmp_path):
    files, out = write_files(tmp_path), tmp_path / "agent.json"
    proc = run_wisp(["agent", "--model", "demo", "--tools", "--sessions", *files, "--concurrency", "3",
                     "--vram-budget", "600MiB", "--max-model-len", "2048", "--max-reply-tokens", "16",
                     "--device", "cpu",
                     "--arms", "mv-wsa", "--recompute-cost", "1e-5", "--out", out],
                    tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    [record] = json.loads(out.read_text())
    assert record["tools"] is True and record["turns"] == 8 and record["grammar_mask_s"] > 0
    calls = record["tool_calls"]
    assert sum(calls.values()) == 8 and calls["other"] == 0
    assert {w: sum(p["tool_calls"].values()) for w, p in record["per_workflow"].items()} == {"os": 3, "db": 3, "kg": 2}
    assert "tool calls:" in proc.stdout
