"""llguidance over a byte vocabulary, and a random walk through a grammar: what a random model would write when a
forced tool call's grammar masks its logits.

The vocabulary: token b < 256 is the byte b, then harmony's special tokens (so gpt-oss's grammar, which names them
with llguidance's `<|name|>` syntax, compiles), then EOS. Special tokens decode to their text, as a server that keeps
special tokens decodes them.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

import llguidance

SPECIALS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")
EOS_TEXT = "<|endoftext|>"


class ByteVocabulary:
    """The object `llguidance.TokenizerWrapper` wraps: `tokens` (each token's bytes), `eos_token_id`,
    `bos_token_id`, `special_token_ids`, and calling it tokenizes bytes (one token per byte)."""

    def __init__(self):
        self.tokens = [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIALS + (EOS_TEXT,)]
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = list(range(256, len(self.tokens)))

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


@lru_cache(maxsize=1)
def byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()))


def compile_error(grammar_text: str) -> str:
    """"" if the Lark grammar compiles against the byte tokenizer, else llguidance's message."""
    return llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar_text),
                                                 byte_tokenizer())


def tokens_of(text: str) -> list[int]:
    """`text` in the byte vocabulary: each special token's text as that token, all else byte by byte."""
    tokens: list[int] = []
    for part in re.split("(" + "|".join(map(re.escape, SPECIALS)) + ")", text):
        tokens += [256 + SPECIALS.index(part)] if part in SPECIALS else list(part.encode("utf-8"))
    return tokens


def accepts(grammar_text: str, text: str | list[int]) -> bool:
    """Whether the grammar takes `text` (or these tokens) as a whole reply: every token allowed, and the grammar
    complete after them."""
    tokens = tokens_of(text) if isinstance(text, str) else text
    matcher = llguidance.LLMatcher(byte_tokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar_text), log_level=0)
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


def allowed_tokens(matcher: llguidance.LLMatcher, vocab_size: int) -> list[int]:
    mask = matcher.compute_bitmask()  # little-endian 32-bit words: token t is bit t % 8 of byte t // 8
    return [t for t in range(vocab_size) if mask[t >> 3] >> (t & 7) & 1]


def walk(grammar_text: str, rng: random.Random, max_steps: int = 4000) -> str | None:
    """The text of a walk that takes a uniformly random allowed token at each step until the matcher stops (the
    grammar is complete and EOS was taken, or nothing can follow), or None if it has not after `max_steps`."""
    tokenizer = byte_tokenizer()
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar_text), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens: list[int] = []
    for _ in range(max_steps):
        if matcher.is_stopped():
            return tokenizer.decode_bytes(tokens).decode("utf-8")
        token = rng.choice(allowed_tokens(matcher, tokenizer.vocab_size))
        assert matcher.consume_token(token), matcher.get_error()
        if token != tokenizer.eos_token:
            tokens.append(token)
    return None
