"""Content trimming and held tails (wisp/server/tool_calls/content.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wisp.server.tool_calls.content import StrippedContent, earliest, held_tail, reply_content

WHITESPACY = st.text(st.sampled_from(" \t\n\u3000\u00a0ab\u00e9"), max_size=30)


@given(st.lists(WHITESPACY, max_size=8))
def test_stripped_content_sends_what_strip_leaves_of_the_whole(pieces):
    stripped = StrippedContent()
    sent = "".join(stripped.push(p) for p in pieces) + stripped.finish()
    assert sent == "".join(pieces).strip()
    assert (reply_content(pieces) or "") == sent


def test_stripped_content_holds_a_whitespace_run_until_text_follows():
    stripped = StrippedContent()
    assert stripped.push("  \n") == ""
    assert stripped.push("a ") == "a"
    assert stripped.push(" \n") == ""
    assert stripped.push("b") == "  \nb"
    assert stripped.push("\n") == ""
    assert stripped.finish() == ""


def test_reply_content_is_none_when_only_whitespace_is_left():
    assert reply_content(["", " \n", "\t"]) is None
    assert reply_content([]) is None
    assert reply_content([" a ", "b "]) == "a b"


@given(st.text(st.sampled_from("<tol_c/a>x"), max_size=20))
def test_held_tail_is_the_longest_suffix_that_may_start_a_tag(text):
    tags = ("<tool_call>", "</tool_call>")
    size = held_tail(text, tags)
    could_start = [k for k in range(1, len(text) + 1) if any(len(t) > k and t.startswith(text[-k:]) for t in tags)]
    assert size == max(could_start, default=0)


def test_held_tail_holds_nothing_for_a_whole_tag_or_plain_text():
    assert held_tail("a <tool_call>", ("<tool_call>",)) == 0
    assert held_tail("hello", ("<tool_call>",)) == 0
    assert held_tail("hello <tool", ("<tool_call>",)) == len("<tool")
    assert held_tail("", ("<tool_call>",)) == 0


def test_earliest_finds_the_first_marker_from_a_position():
    assert earliest("a<|end|>b<|call|>", ("<|call|>", "<|end|>")) == (1, "<|end|>")
    assert earliest("a<|end|>b<|call|>", ("<|call|>", "<|end|>"), 2) == (9, "<|call|>")
    assert earliest("plain", ("<|end|>",)) is None
