"""Pieces of the forced-tool-call grammars the formats build (llguidance's Lark dialect, `%json {schema}` inline).

- `forced_functions(tools, choice)`: the functions a forced call may name, each with the JSON schema its arguments
  must follow.
- `lark_literal(text)`: a Lark string literal matching exactly `text`.
- `json_rule(schema)`: a `%json {...}` body for a schema.

Invariants:
- The arguments are always a JSON object: a tool without parameters (absent or `{}`) takes only `{}` (as OpenAI
  reads "omitting parameters defines a function with an empty parameter list"); a schema without a "type" is
  given "type": "object". Otherwise the tool's schema is used as it is (strict: a keyword llguidance does not
  support fails the grammar's compilation, which the server reports as a 400 on tool_choice).
- The JSON layout is fixed (`JsonLayout`): no free whitespace, one separator spelling, so a sampled walk ends and
  the model sees the layout it was trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class JsonLayout:
    """How forced JSON is spelled: the separators between items and between a key and its value, nothing else.
    (llguidance reads separators as regexes: these are plain text, with no regex metacharacters.)"""

    item_separator: str = ","
    key_separator: str = ":"

    def __post_init__(self):
        for sep in (self.item_separator, self.key_separator):
            if re.escape(sep).replace("\\ ", " ") != sep:
                raise ValueError(f"a JSON separator must be plain text, not {sep!r}")

    def options(self) -> dict:
        """llguidance's top-level "x-guidance" options for this layout."""
        return {"whitespace_flexible": False, "item_separator": self.item_separator,
                "key_separator": self.key_separator}


COMPACT = JsonLayout()
SPACED = JsonLayout(", ", ": ")  # Python's json.dumps default, which Qwen's chat templates render calls with


@dataclass(frozen=True)
class ForcedFunction:
    """A function a forced call may name, and the JSON schema (with layout options) its arguments follow."""

    name: str
    schema: dict


def arguments_schema(parameters: dict | None, layout: JsonLayout) -> dict:
    """The schema a call's arguments object must follow, for a tool's `parameters` (see the module invariants)."""
    schema = {"x-guidance": layout.options(), **(parameters or NO_PARAMETERS)}
    schema["x-guidance"] = layout.options()  # the tool's own, if any, would change the layout
    schema.setdefault("type", "object")
    return schema


def forced_functions(tools: list[dict], choice: str, layout: JsonLayout) -> list[ForcedFunction]:
    """The functions of `tools` a forced call may name: all of them for "required", else the one named `choice`."""
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if not functions:
        raise ValueError("a forced tool call needs at least one function tool")
    if choice != "required":
        functions = [f for f in functions if f["name"] == choice]
        if not functions:
            raise ValueError(f"tool_choice names function {choice!r}, which is not in tools")
    return [ForcedFunction(f["name"], arguments_schema(f.get("parameters"), layout)) for f in functions]


def lark_literal(text: str) -> str:
    """A Lark string literal for `text` (JSON's string escapes, which llguidance's Lark reads the same way)."""
    return json.dumps(text, ensure_ascii=True)


def json_rule(schema: dict) -> str:
    """An inline JSON-schema rule body: `%json {...}` on one line."""
    return "%json " + json.dumps(schema, ensure_ascii=True, sort_keys=False)
