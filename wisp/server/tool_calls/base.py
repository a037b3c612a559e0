"""The contract of a tool-call format: how one model family writes OpenAI-style tool calls in its reply text.

A `ToolCallFormat` knows three things about its family:
- `parse(text)`: a whole reply -> `ParsedReply` (the user-visible content and the calls, in order);
- `streamer()`: a fresh `ToolCallStream` that turns the same reply, arriving as append-only text deltas, into
  `ReplyDelta`s (content fragments and tool-call deltas in the shape OpenAI streams them);
- `grammar(tools, choice, parallel)`: an llguidance Lark grammar that forces a reply to be tool call(s) in this
  format, each call's arguments valid under its tool's `parameters` JSON schema (`tool_choice` "required" or a
  named function).

Invariants every format keeps:
- Model output never raises: text that looks like a call but is not one (its JSON does not parse, it is not an
  object, it has no name) stays in the content, so nothing the model wrote is lost.
- Content is trimmed as `str.strip()` trims the concatenation of all content text; content that is empty or
  whitespace only is None (`ParsedReply.content`).
- Streaming agrees with parsing, however the text is split: the streamed content fragments concatenate to
  `parse(text).content or ""`, and the streamed calls have the same names, arguments and order as
  `parse(text).tool_calls`. A stream never retracts: it holds back any tail that could still become a call's tag.
- A call's `arguments` is the JSON text of an object: compact, non-ASCII kept, numbers as exact as the model wrote
  them, always encodable as UTF-8 (`wisp.server.tool_calls.arguments`).
- Call ids are "call_" + 24 hex digits from the format's random source (`os.urandom` unless a test fixes it).

Formats are registered by name in `wisp.server.tool_calls.registry`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Literal

RandomBytes = Callable[[int], bytes]
"""A source of random bytes: `os.urandom`, or `random.Random(seed).randbytes` where a test fixes the ids."""


def new_call_id(random_bytes: RandomBytes = os.urandom) -> str:
    """A tool call's id as OpenAI spells them: "call_" + 24 hex digits (12 random bytes)."""
    return "call_" + random_bytes(12).hex()


@dataclass(frozen=True)
class ToolCall:
    """One call of a function tool: `arguments` is the JSON text of an object, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedReply:
    """A whole reply split into what the user reads and the calls the model made.

    `content` is the text outside tool calls, stripped, None when nothing but whitespace is left. `reasoning` is
    text the format marks as the model's thinking (harmony's analysis channel), None where there is none; it is
    never part of `content`."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None


@dataclass(frozen=True)
class CallDelta:
    """A fragment of call `index` (0-based, in reply order), as OpenAI streams tool calls: the call's first delta
    carries its `id` and `name` (and the wire adds type "function"), later ones only an `arguments` fragment. The
    fragments of one call concatenate to its `ToolCall.arguments`."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ReplyDelta:
    """One step of a streamed reply: exactly one of a content fragment (`content`) and a tool-call delta (`call`)."""

    content: str | None = None
    call: CallDelta | None = None

    def __post_init__(self):
        if (self.content is None) == (self.call is None):
            raise ValueError("a ReplyDelta carries exactly one of content and call")

    @classmethod
    def text(cls, content: str) -> "ReplyDelta":
        return cls(content=content)

    @classmethod
    def deltas_of_call(cls, index: int, call: ToolCall) -> list["ReplyDelta"]:
        """A whole call as OpenAI streams one: the head (id, name, arguments "") then the arguments in one piece."""
        return [cls(call=CallDelta(index, call.id, call.name, "")),
                cls(call=CallDelta(index, None, None, call.arguments))]


class ToolCallStream(ABC):
    """One reply's text, fed as append-only deltas, turned into `ReplyDelta`s (see the module's invariants).

    `feed` may be given "" (a step that produced no settled text) and returns what can be sent now; `finish` is
    called once, after the last `feed`, and flushes what was held back (an unterminated call is parsed as it is, as
    `parse` would). Nothing may be fed after `finish`. Both formats here send a call only once it is complete (its
    head, then its whole arguments), since an incomplete call may still turn out not to be one and go to the
    content instead; content is sent as it comes."""

    @abstractmethod
    def feed(self, delta_text: str) -> list[ReplyDelta]: ...

    @abstractmethod
    def finish(self) -> list[ReplyDelta]: ...


ToolChoice = Literal["required"] | str
"""What a forced tool call may call: "required" (any of the tools) or one function's name."""


class ToolCallFormat(ABC):
    """How one model family writes tool calls (see the module docstring for the contract).

    Instances are stateless apart from their random source (shared by all requests of a server); `streamer()` makes
    the per-reply state. `name` is set by the registry."""

    name: str = ""
    keeps_special_tokens: bool = False  # its markers are special tokens: the reply is decoded with them kept

    def __init__(self, random_bytes: RandomBytes = os.urandom):
        self._random_bytes = random_bytes

    def new_call(self, name: str, arguments: str) -> ToolCall:
        return ToolCall(new_call_id(self._random_bytes), name, arguments)

    @abstractmethod
    def parse(self, text: str) -> ParsedReply:
        """The content and calls of a whole reply; never raises on model output."""

    @abstractmethod
    def streamer(self) -> ToolCallStream:
        """A fresh stream for one reply."""

    @abstractmethod
    def grammar(self, tools: list[dict], choice: ToolChoice, parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) forcing the reply to be call(s) to `tools` in this format.

        `tools` are OpenAI's tool dicts ({"type": "function", "function": {"name", "description", "parameters"}});
        `choice` is "required" (any tool) or one tool's name; `parallel` allows one or more calls where the format
        can carry several in one reply, else exactly one. The JSON is compact with fixed separators, so a
        sampled walk through the grammar ends. ValueError if `choice` names no tool in `tools` or `tools` is empty."""
