"""The server's prompt encoder (`wisp.server.prompt_encoder`): ids equal the tokenizer's own for any text that may
fit; a text that cannot fit is refused from pieces of it, with a count that never exceeds the true one; a
tokenizer from a file encodes in worker processes, and a worker that dies fails one request, not the server."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.async_engine import RequestFailed
from wisp.engine.tokenizer import TextTokenizer
from wisp.models.demo import demo_path
from wisp.server import prompt_encoder
from wisp.server.prompt_encoder import PromptEncoder, TooLong, encode_within


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(demo_path() / "tokenizer.json")


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of 64 characters, texts over 256 counted first: the same rule at sizes hypothesis can reach."""
    monkeypatch.setattr(prompt_encoder, "PIECE_CHARS", 64)
    monkeypatch.setattr(prompt_encoder, "WHOLE_CHARS", 256)


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.sampled_from("ab c\n\u00e9\u4e2d"), max_size=2000), limit=st.integers(1, 3000))
def test_ids_are_the_tokenizers_own_or_the_text_cannot_fit(tokenizer, text, limit):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prompt_encoder, "PIECE_CHARS", 64)
        patch.setattr(prompt_encoder, "WHOLE_CHARS", 256)
        got = encode_within(tokenizer, text, limit)
    whole = tokenizer.encode(text)
    if isinstance(got, TooLong):
        assert limit <= got.at_least <= len(whole)  # a lower bound, and over the limit
    else:
        assert got == whole


def test_a_text_far_over_the_context_costs_a_few_pieces(tokenizer, small_pieces, monkeypatch):
    calls = []
    monkeypatch.setattr(tokenizer, "encode", lambda text: calls.append(len(text)) or TextTokenizer.encode(tokenizer, text))
    got = encode_within(tokenizer, "word " * 100_000, limit=200)
    assert isinstance(got, TooLong) and got.at_least >= 200
    assert sum(calls) < 1000  # of 500,000 characters


@pytest.mark.slow
def test_worker_processes_encode_and_a_dead_worker_fails_only_its_request(tokenizer):
    encoder = PromptEncoder(tokenizer, workers=1)
    assert encoder.in_processes
    try:
        encoder.warm_up()
        assert asyncio.run(encoder.encode("Hello there", 100)) == tokenizer.encode("Hello there")
        pid = asyncio.run(_worker_pid(encoder))
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RequestFailed, match="worker process died"):
            asyncio.run(encoder.encode("Hello again", 100))
        assert asyncio.run(encoder.encode("Hello again", 100)) == tokenizer.encode("Hello again")  # a fresh pool
    finally:
        encoder.shutdown()


async def _worker_pid(encoder: PromptEncoder) -> int:
    return await asyncio.get_running_loop().run_in_executor(encoder._executor(), os.getpid)
