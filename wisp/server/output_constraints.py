"""What a request's output must follow, as a grammar for the engine: `response_format` (json_object, json_schema),
vLLM's `structured_outputs` (json, regex, Lark grammar, choice), or a forced tool call (`tool_choice` "required" or a
named function, in the model family's tool-call format, `wisp.server.tool_calls`).

`grammar_for` turns a request into (grammar text, the field it came from) or None; `compile_constraints` makes one
fresh `GrammarConstraint` per choice off the event loop. A grammar that does not compile is a 400 naming that field
(`InvalidParameter`), before anything reaches the engine.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from wisp.engine.grammar import json_object_grammar, json_schema_grammar, lark_grammar, regex_grammar
from wisp.errors import InvalidParameter
from wisp.server.output_fields import GrammarRequest, NamedToolChoice
from wisp.server.protocol import ChatCompletionRequest

if TYPE_CHECKING:
    from wisp.engine.grammar import GrammarConstraint, Grammars
    from wisp.server.tool_calls import ToolCallFormat


def grammar_text(request: GrammarRequest) -> str:
    """The llguidance grammar for one `GrammarRequest`."""
    if request.kind == "json_schema":
        try:
            return json_schema_grammar(request.spec)
        except ValueError as exc:
            raise InvalidParameter(request.param, f"{request.param}: the JSON schema is not usable: {exc}") from None
    if request.kind == "json_object":
        return json_object_grammar()
    if request.kind == "regex":
        return regex_grammar(request.spec)
    if request.kind == "grammar":
        return lark_grammar(request.spec)
    if request.kind == "choice":
        return lark_grammar("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in request.spec))
    raise AssertionError(f"unknown grammar kind {request.kind}")


def grammar_for(req, tool_format: "ToolCallFormat | None") -> tuple[str, str] | None:
    """(grammar, field) for a request whose output is constrained, else None."""
    if isinstance(req, ChatCompletionRequest) and req.forces_tool_call and tool_format is not None:
        choice = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else "required"
        parallel = req.parallel_tool_calls is not False and choice == "required"
        return lark_grammar(tool_format.grammar(req.tool_dicts(), choice, parallel)), "tool_choice"
    found = req.grammar_request()
    return None if found is None else (grammar_text(found), found.param)


def compile_constraints(grammars: "Grammars | None", grammar: tuple[str, str] | None,
                        count: int) -> list["GrammarConstraint | None"]:
    """`count` independent matchers for `grammar` (one per choice), or Nones when there is no grammar."""
    if grammar is None:
        return [None] * count
    text, param = grammar
    if grammars is None:
        raise InvalidParameter(param, f"{param}: constrained output needs the model's tokenizer.json")
    return [grammars.constraint(text, param) for _ in range(count)]
