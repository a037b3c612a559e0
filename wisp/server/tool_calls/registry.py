"""The registry of tool-call formats, one axis of variation: a format's name (what `--tool-call-format` would take)
-> its `ToolCallFormat` class, filled by `@register_tool_call_format("name")` on the class, which also sets the
class's `name`. A name is registered once."""

from __future__ import annotations

from typing import Callable, TypeVar

from wisp.server.tool_calls.base import ToolCallFormat

TOOL_CALL_FORMATS: dict[str, type[ToolCallFormat]] = {}

F = TypeVar("F", bound=type[ToolCallFormat])


def register_tool_call_format(name: str) -> Callable[[F], F]:
    """Class decorator: TOOL_CALL_FORMATS[name] = the class; ValueError if `name` is taken."""

    def register(cls: F) -> F:
        if name in TOOL_CALL_FORMATS:
            raise ValueError(f"tool-call format {name!r} is already registered ({TOOL_CALL_FORMATS[name].__name__})")
        cls.name = name
        TOOL_CALL_FORMATS[name] = cls
        return cls

    return register
