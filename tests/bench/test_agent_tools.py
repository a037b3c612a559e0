"""AgentInstruct conversations as tool sessions (`wisp.bench.agent_tools`): actions that parse become hermes calls
and the observations after them tool messages, the rest stays text; the turns and their prefix sharing survive;
a rendered call is exactly what the forced-call grammar writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wisp.bench.agent_sessions import END_OF_TEXT, load_sessions, train_session_tokenizer
from wisp.bench.agent_tools import GENERIC_TOOLS, TOOL_SETS, call_block, parse_action, tool_messages, workflow_tools
from wisp.errors import WispError

VOCAB = 1000
OS_CONVERSATION = [
    ("user", "You are an agent on a Linux box. How many files are in /etc?"),
    ("assistant", "Think: count them.\n\nAct: bash\n\n```bash\nls -1 /etc | wc -l\n```"),
    ("user", "The output of the OS:\n213"),
    ("assistant", "I am not sure what to do."),  # no action: stays text, and so does the reply to it
    ("user", "Please act."),
    ("assistant", "Think: done.\n\nAct: answer(213)"),
    ("user", "ok"),
    ("assistant", "Act: finish"),
]
DB_CONVERSATION = [
    ("user", "Operate a MySQL database. How many drivers?"),
    ("assistant", "Ok."),
    ("user", "Table drivers has columns driverId, name."),
    ("assistant", "Count them.\nAction: Operation\n```sql\nSELECT COUNT(*) FROM drivers;\n```"),
    ("user", "[(7,)]"),
    ("assistant", 'There are 7.\nAction: Answer\nFinal Answer: ["7"]'),
]


def _block(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _tools_in_header(text: str) -> list[dict]:
    inside = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    return [json.loads(line) for line in inside.split("\n")]


def test_os_actions_become_calls_and_their_observations_tool_messages():
    out = tool_messages("os", OS_CONVERSATION)
    assert out[0][0] == "system" and _tools_in_header(out[0][1]) == workflow_tools("os")
    assert [t["function"]["name"] for t in workflow_tools("os")] == ["bash", "answer", "finish"]
    assert out[1:] == [
        OS_CONVERSATION[0],
        ("assistant", "Think: count them.\n" + _block("bash", {"script": "ls -1 /etc | wc -l"})),
        ("tool", "The output of the OS:\n213"),
        OS_CONVERSATION[3], OS_CONVERSATION[4],
        ("assistant", "Think: done.\n" + _block("answer", {"answer": "213"})),
        ("tool", "ok"),
        ("assistant", _block("finish", {})),  # no thought: the block alone
    ]


def test_db_actions_become_calls_and_a_plain_reply_stays_text():
    out = tool_messages("db", DB_CONVERSATION)
    assert [t["function"]["name"] for t in _tools_in_header(out[0][1])] == ["execute_sql", "commit_final_answer"]
    assert out[1:] == [
        DB_CONVERSATION[0], DB_CONVERSATION[1], DB_CONVERSATION[2],
        ("assistant", "Count them.\n" + _block("execute_sql", {"query": "SELECT COUNT(*) FROM drivers;"})),
        ("tool", "[(7,)]"),
        ("assistant", "There are 7.\n" + _block("commit_final_answer", {"answer": '["7"]'})),
    ]


@pytest.mark.parametrize("workflow, text, expected", [
    ("webshop", "Thought:\nI should search.\n\nAction:\nsearch[red shoes]",
     ("Thought:\nI should search.", "search[red shoes]")),
    ("alfworld", "THOUGHT: look.\n ACTION: go to shelf 1", ("THOUGHT: look.", "go to shelf 1")),
    ("mind2web", "Thought: type it.\nAnswer: B.\nAction: TYPE\nValue: Chicago", ("Thought: type it.\nAnswer: B.",
                                                                                "TYPE\nValue: Chicago")),
    ("kg", "Action: get_relations(Kerosene)", (None, "get_relations(Kerosene)")),
])
def test_other_workflows_call_one_generic_act_tool(workflow, text, expected):
    assert workflow_tools(workflow) == GENERIC_TOOLS
    thought, action = expected
    assert parse_action(workflow, text) == (thought, "act", {"action": action})


@pytest.mark.parametrize("workflow, text", [
    ("os", "Think: hmm.\n\nAct: bash\n\nls /etc"),  # no fenced block
    ("os", "Act: answer()"),  # an empty argument
    ("os", "Act: bash\n\n```bash\nls\n```\nand then some"),  # the action does not end the message
    ("db", "Action: Operation\nSELECT 1;"),
    ("db", "Final Answer: [1]"),  # no "Action: Answer" before it
    ("kg", "Final Answer: #3"),
    ("webshop", "Action:\n   "),
    ("alfworld", "OK. I'll follow your instructions."),
])
def test_unparseable_actions_stay_text(workflow, text):
    assert parse_action(workflow, text) is None
    out = tool_messages(workflow, [("user", "go"), ("assistant", text), ("user", "next")])
    assert out[1:] == [("user", "go"), ("assistant", text), ("user", "next")]


def test_a_system_message_carries_the_tools_after_its_own_text():
    out = tool_messages("db", [("system", "Be brief."), ("user", "hi"), ("assistant", "Ok.")])
    assert out[0][1].startswith("Be brief.\n\n# Tools\n") and out[1:] == [("user", "hi"), ("assistant", "Ok.")]


def test_tool_sets_are_strict_string_schemas():
    for tools in [*TOOL_SETS.values(), GENERIC_TOOLS]:
        for tool in tools:
            params = tool["function"]["parameters"]
            assert params["additionalProperties"] is False and params["required"] == list(params["properties"])
            assert all(p["type"] == "string" for p in params["properties"].values())


@pytest.fixture
def files(tmp_path) -> list[Path]:
    def conversation(messages):
        return [{"role": r, "content": t} for r, t in messages]

    os_file, db_file = tmp_path / "agentinstruct_os_t.json", tmp_path / "agentinstruct_db_t.jsonl"
    os_file.write_text(json.dumps([{"id": "o", "conversations": conversation(OS_CONVERSATION)}]))
    db_file.write_text(json.dumps({"id": "d", "conversations": [{"from": {"user": "human", "assistant": "gpt"}[r],
                                                                 "value": t} for r, t in DB_CONVERSATION]}) + "\n")
    return [os_file, db_file]


def test_tool_sessions_keep_their_turns_and_each_prompt_extends_the_last(files):
    tok = train_session_tokenizer(files, VOCAB, tools=True)
    assert tok.token_to_id(END_OF_TEXT) == 0 and tok.get_vocab_size() <= VOCAB
    plain = load_sessions(files, train_session_tokenizer(files, VOCAB), 1 << 20, None, VOCAB)
    sessions = load_sessions(files, tok, 1 << 20, None, VOCAB, tools=True)
    assert [(s.name, len(s.turns)) for s in sessions] == [(s.name, len(s.turns)) for s in plain] == [
        ("agentinstruct_os_t/o", 4), ("agentinstruct_db_t/d", 3)]
    rendered = tool_messages("os", OS_CONVERSATION)
    first = tok.decode(list(sessions[0].turns[0].prompt_ids))
    assert first == "".join(f"<|{r}|>\n{t}\n" for r, t in rendered[:2]) + "<|assistant|>\n"
    for session in sessions:
        assert all(0 not in t.prompt_ids for t in session.turns)  # END_OF_TEXT ends forced calls, never a prompt
        for prev, turn in zip(session.turns, session.turns[1:]):
            assert turn.prompt_ids[:len(prev.prompt_ids)] == prev.prompt_ids
    call_turn, next_turn = sessions[0].turns[0], sessions[0].turns[1]
    start = len(call_turn.prompt_ids)
    reply = tok.decode(list(next_turn.prompt_ids[start:start + call_turn.reply_tokens]))
    assert reply == rendered[2][1] + "\n"  # the reply's length is the rendered call's
    assert "<|tool|>\nThe output of the OS:\n213\n" in tok.decode(list(next_turn.prompt_ids))


def test_token_count_logs_have_no_text_to_render(tmp_path):
    path = tmp_path / "agentinfer_trace_requests.jsonl"
    path.write_text(json.dumps({"session_id": "s", "actor_id": "a", "started_at": "x", "input_tokens": 9,
                                "output_tokens": 2}) + "\n")
    with pytest.raises(WispError, match="token counts only"):
        load_sessions([path], None, 8, None, VOCAB, tools=True)


def test_a_rendered_call_is_what_the_forced_grammar_writes():
    """Every call the history shows is laid out as the replay forces replies: the grammar takes its text whole."""
    import llguidance  # a dependency of wisp: never skipped
    from wisp.engine.grammar import lark_grammar
    from wisp.models.demo import demo_path
    from wisp.server.tool_calls import HermesFormat

    tokenizer = llguidance.LLTokenizer(str(demo_path() / "tokenizer.json"), n_vocab=259, eos_token=[256])
    for workflow, conversation in [("os", OS_CONVERSATION), ("db", DB_CONVERSATION), ("webshop", [
            ("user", "shop"), ("assistant", 'Action:\nsearch["quoted" \\ thing — ünïcode]')])]:
        grammar = lark_grammar(HermesFormat().grammar(workflow_tools(workflow), "required", False))
        blocks = [parse_action(workflow, t) for r, t in conversation if r == "assistant"]
        assert any(blocks)
        for _, name, arguments in filter(None, blocks):
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            text = call_block(name, arguments)
            assert matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting(), text


def test_the_real_sample_files_render_as_tool_sessions():
    data = Path(__file__).resolve().parents[3] / "shared" / "data" / "agent_sessions"
    if not data.is_dir():
        pytest.skip(f"shared data not present: {data}")
    samples = sorted(data.glob("agentinstruct_*_sample5.json"))
    tok = train_session_tokenizer(samples, 151_936, tools=True)
    sessions = load_sessions(samples, tok, 256, 8192, 151_936, tools=True)
    plain = load_sessions(samples, train_session_tokenizer(samples, 151_936), 256, 8192, 151_936)
    assert {s.workflow for s in sessions} == {"os", "db", "webshop", "kg", "alfworld", "mind2web"}
    assert [len(s.turns) for s in sessions] == [len(s.turns) for s in plain]
    for s in sessions:
        assert all(b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids for a, b in zip(s.turns, s.turns[1:]))
    for path in samples:  # most assistant messages of every workflow are calls
        workflow = path.name.split("_")[1]
        messages = [m for rec in json.loads(path.read_text()) for m in rec["conversations"] if m["role"] == "assistant"]
        calls = [parse_action(workflow, m["content"]) for m in messages]
        assert sum(c is not None for c in calls) >= len(calls) / 2, workflow
