"""Content text as the formats send it: trimmed the way `str.strip()` trims the whole, and never retracted.

- `reply_content(parts)`: a whole reply's content, the concatenation of its content parts stripped, None if empty.
- `StrippedContent`: the same trimming, applied to content that arrives in pieces. Invariant: for any pieces,
  "".join(push(p) for p in pieces) + finish() == "".join(pieces).strip(). It drops leading whitespace and holds a
  whitespace run back until non-whitespace follows it (then sends both), dropping it at the end.
- `held_tail(text, tags)`: how many trailing characters of `text` to hold back because they could be the start of one
  of `tags` (the longest suffix that is a proper prefix of a tag), so content is sent only once it cannot turn out to
  be part of a tag.
"""

from __future__ import annotations

from typing import Iterable


def reply_content(parts: Iterable[str]) -> str | None:
    """The content of a whole reply from its content parts, in order: joined, stripped, None if nothing is left."""
    return "".join(parts).strip() or None


class StrippedContent:
    """Streams content trimmed as `reply_content` trims it (see the module docstring's invariant)."""

    def __init__(self):
        self._started = False
        self._held_space = ""

    def push(self, text: str) -> str:
        """What of `text` (and of whitespace held from before) can be sent now."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._held_space += text
            return ""
        out = self._held_space + body
        self._held_space = text[len(body):]
        return out

    def finish(self) -> str:
        """The end of the content: held trailing whitespace is dropped, so nothing is left to send."""
        self._held_space = ""
        return ""


def held_tail(text: str, tags: tuple[str, ...]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `tags` (0 if none)."""
    longest = min(len(text), max((len(t) for t in tags), default=1) - 1)
    for size in range(longest, 0, -1):
        suffix = text[-size:]
        if any(len(t) > size and t.startswith(suffix) for t in tags):
            return size
    return 0


def earliest(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str] | None:
    """(position, marker) of the marker of `markers` that occurs first in `text` from `start`; None if none does."""
    found = [(i, m) for m in markers if (i := text.find(m, start)) != -1]
    return min(found) if found else None
