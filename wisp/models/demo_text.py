"""The demo's text: Python's own documentation, which every CPython install ships (`pydoc_data.topics`), split into a
training part and a held-out part by topic.

Contract:
- topics are taken in sorted key order; every `HELD_OUT_EVERY`-th one (the 10th, 20th, ...) is held out, the rest
  train; a part is its topics' texts joined by a blank line;
- the demo's tokenizer gives one token a UTF-8 byte, so a part's token count is its byte count and bits per token
  are bits per byte;
- `digest()` names the text exactly (the trainer records it): the topics differ between Python releases, so a demo
  trained on one release and measured on another is measured on slightly different text.
"""

from __future__ import annotations

import hashlib

HELD_OUT_EVERY = 10
SCORE_WINDOW = 512  # tokens a scored window (`wisp.models.text_scoring`): the demo's training context
PARTS = ("train", "held-out")


def topics() -> list[tuple[str, str]]:
    """(key, text) of every pydoc topic, in sorted key order."""
    from pydoc_data.topics import topics as table

    return [(key, table[key]) for key in sorted(table)]


def demo_text(part: str) -> str:
    """The training ("train") or held-out ("held-out") text."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, not {part!r}")
    held_out = part == "held-out"
    return "\n\n".join(text for i, (_, text) in enumerate(topics()) if ((i + 1) % HELD_OUT_EVERY == 0) == held_out)


def digest() -> str:
    """SHA-256 of both parts, in order: which text a figure was measured on."""
    h = hashlib.sha256()
    for part in PARTS:
        h.update(demo_text(part).encode())
        h.update(b"\0")
    return h.hexdigest()
