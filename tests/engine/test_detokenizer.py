"""IncrementalDetokenizer: after every token, its text equals decoding all tokens at once.

The demo's byte-level tokenizer (every byte a token, plus specials): random streams mixing whole
multi-byte characters, lone bytes of them (split characters, invalid UTF-8) and special tokens.
"""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.detokenizer import IncrementalDetokenizer
from wisp.engine.tokenizer import TextTokenizer
from wisp.models.demo import demo_path


@functools.cache
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_dir(demo_path())


def pieces():
    """Token ids of a character (ASCII to 4-byte UTF-8), or one raw id (a byte or a special token)."""
    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=3)
    return st.one_of(text.map(lambda t: tokenizer().encode(t)), st.integers(0, 258).map(lambda i: [i]))


def streams():
    return st.lists(pieces(), max_size=24).map(lambda ps: [i for p in ps for i in p])


@settings(max_examples=200, deadline=None)
@given(streams())
def test_incremental_text_equals_decoding_all_tokens(ids):
    tok = tokenizer()
    detok = IncrementalDetokenizer(tok)
    for n in range(1, len(ids) + 1):
        text = detok.push(ids[:n])
        assert text == tok.decode(ids[:n])
        assert text.startswith(detok.stable) and detok.stable == tok.decode(ids[: detok.read_offset])  # final text


def test_a_character_cut_across_tokens_is_held_back_until_complete():
    tok = tokenizer()
    ids = tok.encode("a\u20acb")  # the euro sign is three bytes
    detok = IncrementalDetokenizer(tok)
    texts = [detok.push(ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts == ["a", "a\ufffd", "a\ufffd", "a\u20ac", "a\u20acb"]
    assert detok.stable == "a\u20acb"
