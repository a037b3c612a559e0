"""AgentInstruct conversations as tool sessions (`wisp bench agent --tools`): each workflow's actions become
OpenAI-style tool calls, laid out as the hermes family (Qwen2.5/Qwen3) renders a conversation with tools.

Tool sets (`workflow_tools`, OpenAI function tools; every property a required string, no other property allowed):
- os: bash(script), answer(answer), finish();
- db: execute_sql(query), commit_final_answer(answer);
- any other workflow (kg, webshop, alfworld, mind2web, ...): act(action).

Actions (`parse_action(workflow, text)`, as the AgentInstruct prompts ask for them; the action ends the message):
- os: "Act: bash" then a ```bash fenced block -> bash(script=the block's body); "Act: answer(X)" -> answer(answer=X);
  "Act: finish" -> finish();
- db: "Action: Operation" then a ```sql fenced block -> execute_sql(query=the block's body);
  "Action: Answer" then "Final Answer: X" -> commit_final_answer(answer=X);
- others: the last line that starts with "Action:" (any case) -> act(action=all text after the marker, stripped).
The thought is the text before the action, stripped (None when empty). A message with no such action, or an empty
argument, is no call: None.

Rendering (`tool_messages(workflow, messages)`: (role, text) messages -> (role, text) messages):
- the first message carries the tools: a system message whose text is the conversation's own system text (when it
  opens with one), a blank line, then `tools_header` (Qwen's "# Tools" block: one tool's JSON a line inside <tools>);
- an assistant message whose action parses becomes its thought, "\\n", then the call as `call_block` writes it
  (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, Python's default JSON separators with non-ASCII
  kept: exactly the layout `HermesFormat.grammar` forces), or the block alone when there is no thought;
- the user message right after a call becomes a "tool" message holding the observation as it was;
- every other message stays as it was (an unparseable action stays text, and so does the reply to it).
Invariant: the messages after the first are the conversation's, one for one and in order (only roles and texts
change), so a session has the same turns (assistant messages) with and without tools.
"""

from __future__ import annotations

import json
import re

TOOL_ROLE = "tool"


def _function(name: str, description: str, **params: str) -> dict:
    """An OpenAI function tool whose parameters are the given required strings (name -> description)."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
        "required": list(params), "additionalProperties": False}}}


TOOL_SETS: dict[str, list[dict]] = {
    "os": [
        _function("bash", "Run a bash script on the Linux (Ubuntu) machine; its output comes back (truncated when "
                  "long).", script="the script, without any input operation"),
        _function("answer", "Answer the question.", answer="the answer"),
        _function("finish", "Say that the task is done."),
    ],
    "db": [
        _function("execute_sql", "Run one SQL statement on the MySQL database; its result rows come back.",
                  query="one SQL statement, on one line"),
        _function("commit_final_answer", "Give the final answer to the question.",
                  answer='the answer, e.g. a JSON list of values such as ["none"] or [12]'),
    ],
}
GENERIC_TOOLS = [_function("act", "Take one action in the environment, written as the task asks (e.g. "
                           "search[keywords], click[value], go to shelf 1, get_relations(entity)).",
                           action="the action")]

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                "<tools>\n{tools}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def workflow_tools(workflow: str) -> list[dict]:
    """The OpenAI tools of a workflow (see the module docstring); a fresh list the caller may keep."""
    return json.loads(json.dumps(TOOL_SETS.get(workflow, GENERIC_TOOLS)))


def tools_header(tools: list[dict]) -> str:
    """The tools block of a system message, as Qwen's chat templates write it (one tool's JSON a line)."""
    return TOOLS_HEADER.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def call_block(name: str, arguments: dict) -> str:
    """One hermes call block, laid out as the forced-call grammar writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# -- actions ----------------------------------------------------------------------------------------
_OS_BASH = re.compile(r"^[ \t]*Act:[ \t]*bash\s*```[^\n]*\n(.*?)\n?```\s*\Z", re.S | re.M)
_OS_ANSWER = re.compile(r"^[ \t]*Act:[ \t]*answer\((.*)\)\s*\Z", re.S | re.M)
_OS_FINISH = re.compile(r"^[ \t]*Act:[ \t]*finish\s*\Z", re.M)
_DB_SQL = re.compile(r"^[ \t]*Action:[ \t]*Operation\s*```[^\n]*\n(.*?)\n?```\s*\Z", re.S | re.M)
_DB_ANSWER = re.compile(r"^[ \t]*Action:[ \t]*Answer[ \t]*\n[ \t]*Final Answer:(.*)\Z", re.S | re.M)
_ACTION = re.compile(r"^[ \t]*Action:", re.I | re.M)

_RULES: dict[str, list[tuple[re.Pattern, str, str | None]]] = {  # (pattern, tool, its argument: group 1)
    "os": [(_OS_BASH, "bash", "script"), (_OS_ANSWER, "answer", "answer"), (_OS_FINISH, "finish", None)],
    "db": [(_DB_SQL, "execute_sql", "query"), (_DB_ANSWER, "commit_final_answer", "answer")],
}


def parse_action(workflow: str, text: str) -> tuple[str | None, str, dict] | None:
    """(thought or None, tool name, arguments) of an assistant message's action, or None (module docstring)."""
    if workflow in _RULES:
        for pattern, name, param in _RULES[workflow]:
            match = pattern.search(text)
            if match is None:
                continue
            arguments = {} if param is None else {param: match.group(1).strip()}
            if param is not None and not arguments[param]:
                return None
            return _thought(text[:match.start()]), name, arguments
        return None
    markers = list(_ACTION.finditer(text))
    if not markers:
        return None
    action = text[markers[-1].end():].strip()
    return (_thought(text[:markers[-1].start()]), "act", {"action": action}) if action else None


def _thought(text: str) -> str | None:
    return text.strip() or None


# -- rendering ----------------------------------------------------------------------------------------
def tool_messages(workflow: str, messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The conversation as a tool session (see the module docstring's rendering rules and invariant)."""
    system, rest = ("", messages)
    if messages and messages[0][0] == "system":
        system, rest = messages[0][1] + "\n\n", messages[1:]
    out = [("system", system + tools_header(workflow_tools(workflow)))]
    called = False  # the message before was a call: this one is its observation
    for role, text in rest:
        if role == "user" and called:
            out.append((TOOL_ROLE, text))
            called = False
            continue
        action = parse_action(workflow, text) if role == "assistant" else None
        called = action is not None
        if action is None:
            out.append((role, text))
            continue
        thought, name, arguments = action
        block = call_block(name, arguments)
        out.append((role, block if thought is None else thought + "\n" + block))
    return out
