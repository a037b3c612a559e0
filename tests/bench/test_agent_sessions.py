"""Agent sessions as token-id workloads: tiny synthetic files of each layout, then the shared real files
(skipped when ../shared/data is absent; it is never copied into the repo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, processors

from wisp.bench.agent_sessions import load_sessions, train_session_tokenizer
from wisp.bench.session_stats import session_stats
from wisp.errors import WispError

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "agent_sessions"  # tests/bench/x.py -> repo -> parent
VOCAB = 1000

OS_SESSIONS = [  # the sample files' layout (role/content)
    {"id": "os_1", "conversations": [
        {"role": "user", "content": "You are an agent on a Linux box. How many files are in /etc?"},
        {"role": "assistant", "content": "Think: count them.\nAct: bash\n```bash\nls /etc | wc -l\n```"},
        {"role": "user", "content": "The output of the OS:\n213"},
        {"role": "assistant", "content": "Think: done.\nAct: answer(213)"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "x"}]},
    {"id": "os_2", "conversations": [
        {"role": "user", "content": "Is there a user named bob?"},
        {"role": "assistant", "content": "Act: bash\n```bash\ngrep bob /etc/passwd\n```"}]},
]
DB_SESSION = {"id": "db_7", "conversations": [  # the full file's layout (from/value, JSON lines)
    {"from": "human", "loss": None, "value": "Operate a MySQL database. How many drivers?"},
    {"from": "gpt", "loss": False, "value": "Ok."},
    {"from": "human", "loss": None, "value": "Table drivers has columns driverId, name."},
    {"from": "gpt", "loss": True, "value": "Action: Operation\n```sql\nSELECT COUNT(*) FROM drivers;\n```"}]}


def infer_request(session: str, actor: str, started: str, inp: int | None, out: int | None) -> dict:
    return {"session_id": session, "actor_id": actor, "actor_role": "lead" if actor == "lead" else "subagent",
            "started_at": f"2026-08-12T04:{started}+00:00", "input_tokens": inp, "output_tokens": out}


@pytest.fixture
def files(tmp_path) -> list[Path]:
    os_file = tmp_path / "agentinstruct_os_sample5.json"
    os_file.write_text(json.dumps(OS_SESSIONS))
    db_file = tmp_path / "agentinstruct_db_full3.jsonl"
    db_file.write_text(json.dumps(DB_SESSION) + "\n")
    return [os_file, db_file]


@pytest.fixture
def tokenizer(files):
    return train_session_tokenizer(files, VOCAB)


def test_agentinstruct_turns_are_assistant_messages_with_whole_conversations(files, tokenizer):
    sessions = load_sessions(files, tokenizer, 1 << 20, None, VOCAB)
    assert [(s.name, s.workflow, len(s.turns)) for s in sessions] == [
        ("agentinstruct_os_sample5/os_1", "os", 3), ("agentinstruct_os_sample5/os_2", "os", 1),
        ("agentinstruct_db_full3/db_7", "db", 2)]
    first = sessions[0].turns[0]
    text = tokenizer.decode(list(first.prompt_ids))
    assert text == f"<|user|>\n{OS_SESSIONS[0]['conversations'][0]['content']}\n<|assistant|>\n"
    reply = OS_SESSIONS[0]["conversations"][1]["content"] + "\n"
    assert first.reply_tokens == len(tokenizer.encode(reply).ids)


def test_each_prompt_extends_the_previous_prompt_and_reply(files, tokenizer):
    for session in load_sessions(files, tokenizer, 1 << 20, None, VOCAB):
        for prev, turn in zip(session.turns, session.turns[1:]):
            assert turn.prompt_ids[:len(prev.prompt_ids)] == prev.prompt_ids
            # then exactly the previous reply's ids: the reply is the next prompt's text, as frameworks resend it
            reply = turn.prompt_ids[len(prev.prompt_ids):len(prev.prompt_ids) + prev.reply_tokens]
            assert tokenizer.decode(list(reply)).endswith("\n")


def test_replies_are_capped_and_never_empty(files, tokenizer):
    sessions = load_sessions(files, tokenizer, 3, None, VOCAB)
    replies = [t.reply_tokens for s in sessions for t in s.turns]
    assert max(replies) == 3 and min(replies) >= 1
    assert sessions[0].turns[2].reply_tokens == len(tokenizer.encode("x\n").ids) < 3


def test_a_prompt_over_the_limit_ends_its_session(files, tokenizer):
    full = load_sessions(files, tokenizer, 8, None, VOCAB)
    limit = len(full[0].turns[1].prompt_ids)
    cut = load_sessions(files, tokenizer, 8, limit, VOCAB)
    assert [len(s.turns) for s in cut] == [2, 1, 2] and cut[0].turns == full[0].turns[:2]
    assert all(len(t.prompt_ids) <= limit for s in cut for t in s.turns)
    with pytest.raises(WispError, match="no session with a turn"):
        load_sessions(files, tokenizer, 8, 2, VOCAB)


def test_the_trained_tokenizer_is_deterministic_and_fits_the_model(files):
    a, b = train_session_tokenizer(files, 300), train_session_tokenizer(files, 300)
    assert a.to_str() == b.to_str() and 256 < a.get_vocab_size() <= 300
    ids = [i for s in load_sessions(files, a, 8, None, 300) for t in s.turns for i in t.prompt_ids]
    assert 0 <= min(ids) and max(ids) < 300
    with pytest.raises(WispError, match="at least 256"):
        train_session_tokenizer(files, 128)


def test_ids_outside_the_models_vocabulary_are_refused(files, tokenizer):
    with pytest.raises(WispError, match=r"outside the model's vocabulary \[0, 260\)"):
        load_sessions(files, tokenizer, 8, None, 260)


def test_a_checkpoint_tokenizer_adds_no_special_tokens_per_message(files):
    """A tokenizer.json whose post-processor adds a BOS, and the engine's list-returning wrapper."""
    vocab = {chr(c): i + 1 for i, c in enumerate(range(32, 127))} | {"<s>": 0, "\n": 96, "[UNK]": 97}
    hf = Tokenizer(models.BPE(vocab, [], unk_token="[UNK]"))  # one id per character
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert hf.encode("ab").ids[0] == 0
    sessions = load_sessions(files, hf, 8, None, 98)
    assert all(0 not in t.prompt_ids for s in sessions for t in s.turns)

    class ListTokenizer:  # wisp.engine.tokenizer.TextTokenizer's shape: encode(text) -> list[int]
        def encode(self, text):
            return hf.encode(text, add_special_tokens=False).ids

    assert load_sessions(files, ListTokenizer(), 8, None, 98) == sessions


def test_agentinfer_sessions_are_synthetic_ids_with_the_real_counts(tmp_path):
    path = tmp_path / "agentinfer_trace_requests.jsonl"
    rows = [infer_request("s1", "lead", "00:02", 30, 5), infer_request("s1", "lead", "00:01", 20, 1000),
            infer_request("s1", "a9", "00:03", 12, 0), infer_request("s1", "lead", "00:04", None, None),
            infer_request("s2", "lead", "00:00", 25, 7), infer_request("s1", "lead", "00:05", 26, None)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sessions = load_sessions([path], None, 64, None, 50)
    assert [(s.name, s.workflow) for s in sessions] == [("s2/lead", "agentinfer"), ("s1/lead", "agentinfer"),
                                                         ("s1/a9", "agentinfer")]
    lead = sessions[1].turns
    assert [(len(t.prompt_ids), t.reply_tokens) for t in lead] == [(20, 64), (30, 5), (26, 1)]
    assert lead[1].prompt_ids[:20] == lead[0].prompt_ids and lead[2].prompt_ids == lead[1].prompt_ids[:26]
    assert all(0 <= i < 50 for s in sessions for t in s.turns for i in t.prompt_ids)
    assert sessions[0].turns[0].prompt_ids != lead[1].prompt_ids[:25]  # a stream per session
    assert load_sessions([path], None, 64, None, 50) == sessions  # the same ids every time
    assert [len(s.turns) for s in load_sessions([path], None, 64, 25, 50)] == [1, 1, 1]


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("[]", "holds no sessions"),
    ("{not json", "not valid JSON"),
    ('[{"prompt": "hi"}]', "unknown format"),
    ('[{"id": 1, "conversations": 5}]', "unexpected record layout"),
])
def test_bad_files_raise_one_clear_error(tmp_path, tokenizer, content, message):
    path = tmp_path / "agentinstruct_os_x.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WispError, match=message):
        load_sessions([path], tokenizer, 8, None, VOCAB)


def test_text_without_a_tokenizer_and_no_files_are_errors(files):
    with pytest.raises(WispError, match="needs a tokenizer"):
        load_sessions(files, None, 8, None, VOCAB)
    with pytest.raises(WispError, match="no agent-session files"):
        load_sessions([], None, 8, None, VOCAB)


def test_stats_count_new_tokens_beyond_the_shared_prefix(files, tokenizer):
    sessions = load_sessions(files, tokenizer, 8, None, VOCAB)
    stats = session_stats(sessions)
    assert (stats.sessions, stats.turns) == (3, 6)
    assert stats.prompt_tokens == sum(len(t.prompt_ids) for s in sessions for t in s.turns)
    # each session's prompts only grow, so its new tokens are its last prompt's length
    assert stats.new_prompt_tokens == sum(len(s.turns[-1].prompt_ids) for s in sessions)
    assert stats.reply_tokens == sum(t.reply_tokens for s in sessions for t in s.turns)


# -- the shared real files --------------------------------------------------------------------------
def test_the_real_sample_files_load_with_prefix_sharing_turns():
    if not DATA.is_dir():
        pytest.skip(f"shared data not present: {DATA}")
    samples = sorted(DATA.glob("agentinstruct_*_sample5.json"))
    tok = train_session_tokenizer(samples, 151_936)
    sessions = load_sessions(samples + [DATA / "agentinfer_trace_requests.jsonl"], tok, 256, 8192, 151_936)
    workflows = {s.workflow for s in sessions}
    assert workflows == {"os", "db", "webshop", "kg", "alfworld", "mind2web", "agentinfer"}
    for s in sessions:
        assert s.turns and all(1 <= t.reply_tokens <= 256 and len(t.prompt_ids) <= 8192 for t in s.turns)
        if s.workflow != "agentinfer":
            assert all(b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids for a, b in zip(s.turns, s.turns[1:]))
