"""Prompt text -> token ids for the server, so that no prompt, however large, stalls the event loop or the engine.

Hugging Face `tokenizers` holds the GIL while it encodes: a multi-megabyte prompt tokenized in a thread of the
server's process froze /health and every stream for seconds. So a tokenizer that comes from a file
(`TextTokenizer`) encodes in worker processes of its own (spawned, each loading the file once), and the server's
process only waits on a future. Other tokenizers (tests' byte tokenizer) encode in threads.

A long text is first counted piece by piece (pieces of `PIECE_CHARS`, cut before a space), stopping as soon as the
count shows it cannot fit `limit` tokens: the pieces' tokens, less `CUT_SLACK` per cut, bound the whole text's from
below (a cut before a space changes nothing where the tokenizer splits words at spaces, as byte-level BPE does; a
cut elsewhere changes the segmentation only near it). So a prompt far over the context costs a few pieces, not the
whole text, and gets its 400 (`TooLong`) at once. A text that may fit is encoded whole, as it always was: its ids
do not depend on the pieces.

A worker that dies (killed, out of memory) fails only the requests it held (`RequestFailed`); the next request
starts a fresh pool.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from wisp.engine.async_engine import RequestFailed

PIECE_CHARS = 1 << 16  # a piece encodes in a few milliseconds
WHOLE_CHARS = 4 * PIECE_CHARS  # shorter texts are encoded whole at once
CUT_SLACK = 16  # tokens a cut may add to the pieces' count


@dataclass(frozen=True)
class TooLong:
    at_least: int  # tokens the text has at least (already >= the limit)


def encode_within(tokenizer, text: str, limit: int) -> list[int] | TooLong:
    """The ids of `text`, or TooLong once pieces of it prove more than `limit` - 1 tokens (see the docstring)."""
    if len(text) > WHOLE_CHARS:
        counted, cuts, start = 0, 0, 0
        while start < len(text):
            end = min(start + PIECE_CHARS, len(text))
            if end < len(text):
                space = text.rfind(" ", start + PIECE_CHARS // 2, end)
                end = space if space > start else end
            counted += len(tokenizer.encode(text[start:end]))
            cuts += end < len(text)
            start = end
            if counted - CUT_SLACK * cuts >= limit:
                return TooLong(counted - CUT_SLACK * cuts)
    return tokenizer.encode(text)


_WORKER_TOKENIZER = None  # in a worker process: the tokenizer it loaded


def _load(path: str) -> None:
    global _WORKER_TOKENIZER
    from wisp.engine.tokenizer import TextTokenizer

    _WORKER_TOKENIZER = TextTokenizer(Path(path))


def _encode_in_worker(text: str, limit: int) -> list[int] | TooLong:
    return encode_within(_WORKER_TOKENIZER, text, limit)


class PromptEncoder:
    """`await encode(text, limit)`: ids or TooLong, computed off the event loop (see the module docstring)."""

    def __init__(self, tokenizer, workers: int = 2):
        self.tokenizer, self.workers = tokenizer, workers
        self.path = getattr(tokenizer, "path", None)  # a TextTokenizer's file: worker processes can load it
        self._pool: Executor | None = None

    @property
    def in_processes(self) -> bool:
        return self.path is not None

    def _executor(self) -> Executor:
        if self._pool is None:
            if self.in_processes:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_load, initargs=(str(self.path),))
            else:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="wisp-tokenize")
        return self._pool

    async def encode(self, text: str, limit: int) -> list[int] | TooLong:
        loop = asyncio.get_running_loop()
        if not self.in_processes:
            return await loop.run_in_executor(self._executor(), encode_within, self.tokenizer, text, limit)
        pool = self._executor()
        try:
            return await loop.run_in_executor(pool, _encode_in_worker, text, limit)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None  # the next request starts a fresh pool
            pool.shutdown(wait=False, cancel_futures=True)
            raise RequestFailed("the tokenizer's worker process died while encoding this prompt") from None

    def warm_up(self) -> None:
        """Start the workers now (a spawned process takes a second or two), not at the first request."""
        if self.in_processes:
            self._executor().submit(_encode_in_worker, "", 1).result()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
