"""The engine's per-token log-probabilities (`TokenLogprobs`) in OpenAI's two wire shapes.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`, a token's text and its exact bytes
(a byte-level token can hold part of a UTF-8 character: its text then shows U+FFFD where the bytes are cut, and
`bytes` says what they are). Completions: parallel lists `tokens`, `token_logprobs`, `top_logprobs` ({text:
logprob}) and `text_offset` (where each token's text starts in the choice's text, echoed prompt included).

The log-probabilities are those the engine sampled from (`wisp.engine.sampling`: after logit_bias, penalties and a
grammar's mask, before temperature, top-k and top-p). An echoed prompt's tokens get the model's own distribution at
each position (teacher forced), its first token none.
"""

from __future__ import annotations

from typing import Callable, Sequence

from wisp.engine.sampling import TokenLogprobs
from wisp.errors import WispError
from wisp.server.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


class TokenTexts:
    """Token id -> (text, bytes), from `token_bytes` (llguidance's view of the tokenizer, exact for every kind of
    tokenizer) or, without it, the tokenizer's own decode of the one token."""

    def __init__(self, token_bytes: Callable[[int], bytes] | None, decode: Callable[[list[int]], str] | None):
        self._bytes, self._decode = token_bytes, decode
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token: int) -> tuple[str, bytes]:
        found = self._cache.get(token)
        if found is None:
            raw = self._exact_bytes(token)
            if raw is not None:
                found = raw.decode("utf-8", errors="replace"), raw
            else:
                text = self._decode([token]) if self._decode is not None else f"<{token}>"
                found = text, text.encode("utf-8")
            self._cache[token] = found
        return found

    def _exact_bytes(self, token: int) -> bytes | None:
        if self._bytes is None:
            return None
        try:
            return self._bytes(token)
        except WispError:  # the grammar engine cannot read this tokenizer: the tokenizer's own decode, from now on
            self._bytes = None
            return None


def chat_logprobs(entries: Sequence[TokenLogprobs], texts: TokenTexts) -> ChatLogprobs:
    def top(token: int, logprob: float) -> TopLogprob:
        text, raw = texts(token)
        return TopLogprob(token=text, logprob=logprob, bytes=list(raw))

    content = []
    for e in entries:
        text, raw = texts(e.token)
        content.append(ChatTokenLogprob(token=text, logprob=e.logprob, bytes=list(raw),
                                        top_logprobs=[top(t, lp) for t, lp in e.top]))
    return ChatLogprobs(content=content)


def completion_logprobs(entries: Sequence[TokenLogprobs | None], tokens: Sequence[int], texts: TokenTexts,
                        start: int = 0) -> CompletionLogprobs:
    """Completions' logprobs for `tokens` (an entry of None: a token with no distribution, the echoed prompt's
    first); `start`: the text offset of the first token."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    offset = start
    for token, e in zip(tokens, entries):
        text, _ = texts(token)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        out.token_logprobs.append(None if e is None else e.logprob)
        out.top_logprobs.append(None if e is None else {texts(t)[0]: lp for t, lp in e.top})
    return out
