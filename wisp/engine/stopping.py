"""When a request ends, checked after each sampled token: its stop tokens (and the model's EOS unless
`ignore_eos`), a grammar that allows nothing more, its token limits, and its stop strings.

A stop string ends the request with its text cut before the string's first occurrence. The text is
searched incrementally: every earlier step searched the text it had then and found nothing, so only
occurrences ending in text that is new (or was not yet final, see `IncrementalDetokenizer`) can match,
and the search starts there; it finds what a search of the whole text would.
"""

from __future__ import annotations

from typing import Collection

from wisp.engine.sequence import Sequence


def stop_reason(seq: Sequence, token: int, eos_token_ids: Collection[int]) -> str | None:
    """Why seq ends now that `token` is its last output token ("stop", "length"), or None; updates
    seq.text (cut before a stop string) when the request has a tokenizer."""
    p = seq.params
    reason = None
    if token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
        reason = "stop"
    elif seq.constraint is not None and seq.constraint.finished:  # its grammar allows no further token
        reason = "stop"
    elif len(seq.output_ids) >= p.max_tokens or len(seq) >= seq.max_len:
        reason = "length"
    if seq.detokenizer is not None and update_text(seq):
        reason = "stop"
    return reason


def update_text(seq: Sequence) -> bool:
    """seq.text from all its output tokens, cut before the first stop string; whether one was found."""
    final = seq.detokenizer.stable  # text searched by earlier steps (it is final: later text extends it)
    text = seq.detokenizer.push(seq.output_ids)
    searched = len(final) if text.startswith(final) else 0
    found = False
    for stop in seq.params.stop:
        cut = text.find(stop, max(0, searched - len(stop) + 1))
        if cut >= 0:
            text, found = text[:cut], True
    seq.text = text
    return found
