"""The field types of wisp's OpenAI requests: text that must be valid Unicode, integers that may arrive as whole floats,
and what the OpenAPI document says a field accepts.

Invariant: every string a request carries that wisp reads (`Text`: model, prompt, stop, user, message roles, contents
and extra message keys, tool definitions) is valid Unicode: JSON can spell a lone UTF-16 surrogate (`"\\ud800"`),
which no encoder or tokenizer accepts, so it is a validation error naming its field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, WithJsonSchema


_SURROGATE = re.compile("[\ud800-\udfff]")


def unencodable_at(text: str) -> int | None:
    """The index of the first character of `text` that UTF-8 cannot encode (a lone surrogate), or None."""
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def _first_unencodable(value: Any, path: str = "") -> tuple[str, str, int] | None:
    """(path, text, index) of the first string under `value` (str, list, dict or model, walked in order)
    holding a lone surrogate; path is relative (`.0.text`, `.name`, or "" for `value` itself)."""
    if isinstance(value, str):
        at = unencodable_at(value)
        return None if at is None else (path, value, at)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _first_unencodable(str(key), f"{path}.<key>") or _first_unencodable(item, f"{path}.{key}")
        if found is not None:
            return found
    return None


def check_encodable(value: Any) -> Any:
    found = _first_unencodable(value)
    if found is not None:
        path, text, at = found
        where = f"{path.lstrip('.')}: " if path else ""
        raise ValueError(f"{where}the text holds a lone UTF-16 surrogate (U+{ord(text[at]):04X} at character {at}), "
                         "which is not valid Unicode: send valid UTF-8 (an escaped surrogate must be half of a pair)")
    return value


Encodable = AfterValidator(check_encodable)
"""Checks, after the type, that every string in a value is valid Unicode (no lone surrogate)."""
Text = Annotated[str, Encodable]
"""A request string wisp reads: valid Unicode, else a 400 naming its field."""


def _whole(value: Any) -> Any:
    """A float with no fractional part as the int it spells (JSON Schema's `integer` admits 16.0); else as it is,
    for the strict int check to judge."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole)]
"""An integer request field: an int, or a float with no fractional part (`16.0`); never a string or a bool."""


# What the OpenAPI document says a field accepts: the values the validators let through, not just the Python type
# (the validation itself is unchanged; 400s keep their own messages).
def accepts(schema: dict[str, Any], nullable: bool = True) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]} if nullable else schema)
