"""gpt-oss's harmony format, as its decoded reply text reads (special tokens kept), e.g.

    <|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

(one line in the reply) or, answering, `<|channel|>final<|message|>It is sunny.<|return|>`. The prompt ends with
`<|start|>assistant`, so the reply's first message starts at its header.

A reply is a sequence of messages: a header, `<|message|>`, then a body up to `<|end|>`, `<|call|>`, `<|return|>`,
the next `<|start|>`, or the end of the reply. The header names the channel (`<|channel|>analysis`, `commentary`,
`final`) and may name a recipient (`to=functions.NAME`, after the channel or before `<|channel|>`).

Reading rules (`parse`, and the stream, which agrees with it):
- A message to `functions.NAME` (any channel) is a call of NAME when its body is a JSON object; otherwise its body
  is content.
- Any other message on the analysis channel is reasoning (`ParsedReply.reasoning`, joined by "\\n"), never content.
- Any other message (final, commentary preambles, unknown channels) is content.
- Text before a `<|start|>` or the reply's end that never reached `<|message|>` (a header cut short, or a reply
  decoded without its special tokens) is content when it holds no "<|", else dropped.
- Content is the bodies' concatenation, trimmed as `wisp.server.tool_calls.content` says.

The stream sends a content message's body as it comes, holding back a tail that could start a marker, and a call
(its head, then its whole arguments) once its message ends. A header is held until its `<|message|>`, so a reply
with no harmony markers at all (decoded without special tokens) comes out only at `finish`.

A forced call's grammar uses the special tokens themselves (`<|channel|>`, ...: llguidance's `<|name|>` syntax), so
it compiles only against a tokenizer that has them (gpt-oss's). gpt-oss ends its turn at `<|call|>`, so a forced
reply is always exactly one call (`parallel` cannot add more).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wisp.server.tool_calls.arguments import arguments_text, load_json, load_object
from wisp.server.tool_calls.base import ParsedReply, ReplyDelta, ToolCallFormat, ToolCallStream
from wisp.server.tool_calls.content import StrippedContent, earliest, held_tail, reply_content
from wisp.server.tool_calls.grammar import COMPACT, forced_functions, json_rule, lark_literal
from wisp.server.tool_calls.registry import register_tool_call_format

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
HEADER_ENDS = (MESSAGE, START)
BODY_ENDS = (END, CALL, RETURN, START)
FUNCTIONS = "functions."

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?<![^\s>])to=([^\s<]+)")


@dataclass(frozen=True)
class HarmonyHeader:
    """What a message's header says: its channel and its recipient, each None when not named."""

    channel: str | None
    recipient: str | None

    @classmethod
    def read(cls, text: str) -> "HarmonyHeader":
        channel, recipient = _CHANNEL.search(text), _RECIPIENT.search(text)
        return cls(channel and channel.group(1), recipient and recipient.group(1))

    @property
    def function(self) -> str | None:
        """The function the message calls (recipient `functions.NAME`), or None."""
        if self.recipient and self.recipient.startswith(FUNCTIONS) and len(self.recipient) > len(FUNCTIONS):
            return self.recipient[len(FUNCTIONS):]
        return None

    @property
    def is_reasoning(self) -> bool:
        return self.function is None and self.channel == "analysis"


def read_arguments(body: str) -> str | None:
    """A call message's arguments JSON text, or None when its body is not a JSON object."""
    arguments = load_object(load_json(body))
    return None if arguments is None else arguments_text(arguments)


def is_content_stray(text: str) -> bool:
    """Whether text that never became a message (see the reading rules) is content."""
    return "<|" not in text


@register_tool_call_format("harmony")
class HarmonyFormat(ToolCallFormat):
    """gpt-oss's harmony messages (see the module docstring)."""

    keeps_special_tokens = True  # <|channel|>, <|message|>, <|call|> ... are special tokens of gpt-oss's vocabulary

    def parse(self, text: str) -> ParsedReply:
        content: list[str] = []
        reasoning: list[str] = []
        calls = []
        pos = 0
        while pos < len(text):
            found = earliest(text, HEADER_ENDS, pos)
            if found is None or found[1] == START:
                stop = len(text) if found is None else found[0]
                if is_content_stray(text[pos:stop]):
                    content.append(text[pos:stop])
                pos = len(text) if found is None else stop + len(START)
                continue
            header = HarmonyHeader.read(text[pos:found[0]])
            body_start = found[0] + len(MESSAGE)
            end = earliest(text, BODY_ENDS, body_start)
            body = text[body_start:len(text) if end is None else end[0]]
            pos = len(text) if end is None else end[0] + len(end[1])
            arguments = read_arguments(body) if header.function is not None else None
            if arguments is not None:
                calls.append(self.new_call(header.function, arguments))
            elif header.is_reasoning:
                reasoning.append(body)
            else:
                content.append(body)
        return ParsedReply(reply_content(content), tuple(calls), "\n".join(reasoning).strip() or None)

    def streamer(self) -> "HarmonyStream":
        return HarmonyStream(self)

    def grammar(self, tools: list[dict], choice: str, parallel: bool) -> str:
        """`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>`, exactly one call
        (`parallel` is moot: gpt-oss's turn ends at `<|call|>`); ARGS follows the tool's parameters, compact."""
        functions = forced_functions(tools, choice, COMPACT)
        lines = ["start: " + " | ".join(f"call_{i}" for i in range(len(functions)))]
        for i, function in enumerate(functions):
            recipient = lark_literal(f"commentary to={FUNCTIONS}{function.name} ")
            lines.append(f"call_{i}: {CHANNEL} {recipient} {CONSTRAIN} \"json\" {MESSAGE} args_{i} {CALL}")
            lines.append(f"args_{i}: {json_rule(function.schema)}")
        return "\n".join(lines) + "\n"


class HarmonyStream(ToolCallStream):
    """One reply in the harmony format, streamed (see the module docstring)."""

    def __init__(self, fmt: HarmonyFormat):
        self._format = fmt
        self._pending = ""  # unsent text: a header so far, or a held tail of a body
        self._scanned = 0  # in a header: where the search for its end resumes
        self._header: HarmonyHeader | None = None  # the current message's header once its body has begun
        self._call_body: list[str] = []
        self._content = StrippedContent()
        self._calls = 0

    def feed(self, delta_text: str) -> list[ReplyDelta]:
        self._pending += delta_text
        return self._drain(final=False)

    def finish(self) -> list[ReplyDelta]:
        out = self._drain(final=True)
        self._content.finish()
        return out

    def _drain(self, final: bool) -> list[ReplyDelta]:
        out: list[ReplyDelta] = []
        while True:
            if self._header is None:
                found = earliest(self._pending, HEADER_ENDS, self._scanned)
                if found is None:
                    if final:
                        self._stray(out, self._pending)
                        self._pending = ""
                    self._scanned = max(0, len(self._pending) - len(MESSAGE) + 1)
                    return out
                pos, marker = found
                if marker == START:
                    self._stray(out, self._pending[:pos])
                else:
                    self._header, self._call_body = HarmonyHeader.read(self._pending[:pos]), []
                self._pending, self._scanned = self._pending[pos + len(marker):], 0
                continue
            found = earliest(self._pending, BODY_ENDS)
            if found is None:
                keep = len(self._pending) if final else len(self._pending) - held_tail(self._pending, BODY_ENDS)
                self._body(out, self._pending[:keep])
                self._pending = self._pending[keep:]
                if final:
                    self._end_message(out)
                return out
            pos, marker = found
            self._body(out, self._pending[:pos])
            self._pending = self._pending[pos + len(marker):]
            self._end_message(out)

    def _stray(self, out: list[ReplyDelta], text: str) -> None:
        if is_content_stray(text):
            self._send_text(out, text)

    def _body(self, out: list[ReplyDelta], text: str) -> None:
        if self._header.function is not None:
            self._call_body.append(text)
        elif not self._header.is_reasoning:
            self._send_text(out, text)

    def _end_message(self, out: list[ReplyDelta]) -> None:
        header, self._header = self._header, None
        if header.function is None:
            return
        body = "".join(self._call_body)
        arguments = read_arguments(body)
        if arguments is None:
            self._send_text(out, body)
        else:
            out.extend(ReplyDelta.deltas_of_call(self._calls, self._format.new_call(header.function, arguments)))
            self._calls += 1

    def _send_text(self, out: list[ReplyDelta], text: str) -> None:
        sent = self._content.push(text)
        if sent:
            out.append(ReplyDelta.text(sent))
