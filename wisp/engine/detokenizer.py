"""IncrementalDetokenizer: a request's output text, decoding only the new tail of its tokens each step.

Decoding every output token again on every step costs O(n) per token (O(n^2) per request). Instead the
text is kept in two parts:

- `stable`: the text of output tokens [0, read_offset), final: no later token changes it;
- the tail: tokens [read_offset, n), decoded on each step together with a little context before them
  (tokens [prefix_offset, read_offset), already in `stable`) so that a decoder that treats a first token
  specially (a leading-space rule) sees it in its place, and only the difference is taken.

The tail joins `stable` once its text no longer ends in U+FFFD: an incomplete UTF-8 sequence (a
character split across byte tokens) is held back until its last byte arrives. Until then the text is
`stable` + the tail's own (lossy) decoding, which is what decoding all tokens at once gives.

Invariants (tested with hypothesis on the demo's byte-level tokenizer): `push(ids)` returns
`tokenizer.decode(ids)`; `stable` is `tokenizer.decode(ids[:read_offset])` and starts every later text.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"  # what a lossy UTF-8 decode writes for an incomplete or invalid byte sequence


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder):
        self.tokenizer = tokenizer
        self.stable = ""
        self.prefix_offset = 0  # first token of the context decoded with the tail
        self.read_offset = 0  # first token whose text is not in `stable`

    def push(self, ids: list[int]) -> str:
        """The text of all of `ids` (the request's output so far, of which the previous call saw a prefix)."""
        context = self.tokenizer.decode(ids[self.prefix_offset : self.read_offset])
        decoded = self.tokenizer.decode(ids[self.prefix_offset :])
        if not decoded.startswith(context):  # the decoder revised the context: decode everything (never seen)
            return self.tokenizer.decode(ids)
        tail = decoded[len(context) :]
        if tail and not tail.endswith(REPLACEMENT):
            self.stable += tail
            self.prefix_offset, self.read_offset = self.read_offset, len(ids)
            tail = ""
        return self.stable + tail if tail else self.stable
