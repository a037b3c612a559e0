"""Streaming a reply through a `ToolCallStream` in pieces, and the hypothesis strategies that cut it.

`pieces_of(text, cuts)` cuts the reply's UTF-8 bytes (so a cut can fall inside a multi-byte character or a tag) and
decodes them incrementally as an engine's detokenizer would: a cut inside a character gives a piece that ends before
it (possibly ""), and the character comes with the next piece.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from hypothesis import strategies as st

from wisp.server.tool_calls import ReplyDelta, ToolCallFormat


@dataclass(frozen=True)
class Streamed:
    """What a stream sent: the content fragments joined, and each call's (name, arguments fragments joined)."""

    content: str
    calls: tuple[tuple[str, str], ...]
    deltas: tuple[ReplyDelta, ...]


def pieces_of(text: str, cuts: list[int]) -> list[str]:
    data = text.encode("utf-8")
    bounds = [0] + sorted({c for c in cuts if 0 < c < len(data)}) + [len(data)]
    decoder = codecs.getincrementaldecoder("utf-8")()
    return [decoder.decode(data[a:b], final=b == len(data)) for a, b in zip(bounds, bounds[1:])]


@st.composite
def cut_pieces(draw, text: str) -> list[str]:
    """`text` in pieces, cut at up to 12 random byte positions."""
    size = len(text.encode("utf-8"))
    cuts = draw(st.lists(st.integers(0, size), max_size=12)) if size else []
    return pieces_of(text, cuts)


def stream(fmt: ToolCallFormat, pieces: list[str]) -> Streamed:
    """Feed `pieces` then finish; check each delta's OpenAI shape along the way (a call's first delta has its id and
    name, the later ones neither; indices count up from 0 without gaps)."""
    streamer = fmt.streamer()
    deltas = [d for p in pieces for d in streamer.feed(p)] + streamer.finish()
    content, names, arguments = [], [], []
    for delta in deltas:
        if delta.content is not None:
            assert delta.content, "an empty content delta was sent"
            content.append(delta.content)
            continue
        call = delta.call
        if call.index == len(names):  # the call's first delta
            assert call.id is not None and call.id.startswith("call_") and call.name, call
            names.append(call.name)
            arguments.append(call.arguments)
        else:
            assert call.index == len(names) - 1, f"call {call.index} streamed out of order"
            assert call.id is None and call.name is None, call
            arguments[-1] += call.arguments
    return Streamed("".join(content), tuple(zip(names, arguments)), tuple(deltas))


def assert_stream_agrees(fmt: ToolCallFormat, text: str, pieces: list[str]) -> None:
    """The streaming invariant: however `text` is cut, the stream sends parse(text)'s content and calls."""
    assert "".join(pieces) == text
    parsed = fmt.parse(text)
    streamed = stream(fmt, pieces)
    assert streamed.content == (parsed.content or "")
    assert streamed.calls == tuple((c.name, c.arguments) for c in parsed.tool_calls)
