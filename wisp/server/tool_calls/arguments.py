"""JSON as tool calls carry it: reading the model's JSON without ever raising, and writing OpenAI's `arguments` text.

Invariants:
- `load_json` accepts exactly strict JSON (surrounding whitespace allowed) and returns None for anything else
  (NaN/Infinity literals, trailing text, nesting too deep for the parser): model output never raises. Numbers are
  read as `JsonNumber`s, their text as written, so every JSON number survives whatever its size or precision
  (1e400 and 1e99999999999999999999 are valid JSON, though no float or Decimal holds them).
- `arguments_text` writes a value as compact JSON text (no whitespace between tokens), non-ASCII characters kept
  and numbers spelled as they were read; a string holding a lone surrogate (JSON can spell "\\ud800") is written
  with ASCII escapes, so the text is always encodable as UTF-8.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonNumber:
    """A JSON number, kept as the text it was written as (valid JSON number syntax: the parser matched it)."""

    text: str


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> Any:
    """The value of the strict JSON text `text`, or None if it is not one.

    (JSON `null` also reads as None; the callers want objects, so they need not tell the two apart.)"""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=JsonNumber, parse_int=JsonNumber)
    except (ValueError, RecursionError):
        return None


def load_object(value: Any) -> dict | None:
    """`value` as a JSON object: a dict as is, a string holding an object's JSON text read, else None."""
    if isinstance(value, str):
        value = load_json(value)
    return value if isinstance(value, dict) else None


def _string(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape it, which JSON allows and UTF-8 can carry
        return json.dumps(text, ensure_ascii=True)
    return json.dumps(text, ensure_ascii=False)


def _write(value: Any, out: list[str]) -> None:
    if value is None or value is True or value is False:
        out.append(json.dumps(value))
    elif isinstance(value, JsonNumber):
        out.append(value.text)
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (int, float)):
        out.append(json.dumps(value, allow_nan=False))
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"a JSON object's key must be a string, not {key!r}")
            out.append(("," if i else "") + _string(key) + ":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def arguments_text(arguments: dict) -> str | None:
    """OpenAI's `arguments`: the compact JSON text of `arguments`, or None if it cannot be written."""
    out: list[str] = []
    try:
        _write(arguments, out)
    except (ValueError, TypeError, RecursionError):
        return None
    return "".join(out)


def is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
