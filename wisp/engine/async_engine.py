"""`AsyncEngine`: one `LLMEngine` driven by one background thread, consumed from asyncio.

Owns the engine thread, the command queue into it and each request's output queue out of it.

Invariants:
- Every call into the wrapped engine (add_request, abort_request, step, has_unfinished, stats, and what
  `call` runs, such as `apply_plan`) is made on the engine thread, between steps; other threads only post
  commands (FIFO) and read the last stats snapshot.
- A request is live from its admission until its final output is dispatched, its consumer aborts it,
  or the engine shuts down. A consumer that stops early (close, cancellation, garbage collection of
  its stream) aborts its request, so its KV blocks are freed.
- Stats are refreshed on demand, never per step: `engine.stats()` reads every layer's device counters
  back (a host sync), so the thread takes a snapshot only when asked (`refresh_stats`, which /metrics
  awaits at every scrape: it waits for the step in progress, then the next turn snapshots, within a
  timeout, else the last snapshot is served and `stats_age()` says how old it is) and once whenever it
  goes idle after work, so once the thread is idle `stats()` is exact without a scrape.
- The thread sleeps on a condition while there is neither a command nor unfinished work.
- A request that the engine finished with "error" (its own sampling or stop check failed, see
  `wisp.engine.request_failure`) ends its stream with `RequestFailed`; no other request sees it. Only a
  failed step (the shared forward) ends every live request's stream, with `EngineShutDown`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol

import torch

from wisp.engine.request_failure import FINISH_REASON
from wisp.errors import WispError

if TYPE_CHECKING:
    from wisp.engine.engine import LLMEngine, StepOutput
    from wisp.engine.grammar import Grammars
    from wisp.engine.sampling import SamplingParams, TokenConstraint

log = logging.getLogger("wisp.engine")

STATS_TIMEOUT_S = 2.0  # how long a scrape waits for a fresh snapshot before serving the last one


class EngineShutDown(RuntimeError):
    """The engine stopped (shutdown, or a fatal error) before this request finished."""


class RequestFailed(RuntimeError):
    """This request alone failed in the engine (its sampling or stop check); the message is for the client."""


class RequestObserver(Protocol):
    """Receives per-request timings from the engine thread (must be thread-safe)."""

    def observe_ttft(self, seconds: float) -> None: ...

    def observe_inter_token(self, seconds: float) -> None: ...

    def observe_finished(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None: ...


@dataclass
class _Live:
    """Engine-thread bookkeeping of one admitted request."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    prompt_tokens: int
    last_token_time: float | None = None
    completion_tokens: int = 0

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: "SamplingParams"
    live: _Live
    admitted: asyncio.Future = field(repr=False)
    constraint: "TokenConstraint | None" = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    """Run `fn(engine)` on the engine thread between steps; its result (or exception) goes to `done`."""

    fn: Callable[[Any], Any]
    done: concurrent.futures.Future = field(repr=False)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    """Resolve an admission future on its own loop (it may have been cancelled meanwhile)."""

    def settle() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:
        pass


def _refuse(command: "_Add | _Call", error: BaseException | None = None) -> None:
    """Answer a command the engine will not run (it is stopping) with `error`."""
    error = error or EngineShutDown("the engine is shutting down")
    if isinstance(command, _Add):
        _settle(command.admitted, error)
    elif command.done.set_running_or_notify_cancel():
        command.done.set_exception(error)


class RequestStream:
    """The outputs of one admitted request, in order; the last one has `finished` set (unless iterating
    raises: `RequestFailed` when the request failed on its own, `EngineShutDown` when the engine stopped).

    Iterate it with `async for`. `close()` (also on `async with` exit, on cancellation while waiting,
    and when the stream is garbage collected) aborts the request unless it already finished.
    """

    def __init__(self, engine: "AsyncEngine", request_id: str, queue: asyncio.Queue):
        self.request_id = request_id
        self._engine = engine
        self._queue = queue
        self._done = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> "StepOutput":
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            self.close()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._engine.abort(self.request_id)

    async def __aenter__(self) -> "RequestStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class AsyncEngine:
    def __init__(self, engine: "LLMEngine"):
        self.engine = engine  # touch only its immutable facts (tokenizer, chat template, limits) off-thread
        self._observers: list[RequestObserver] = []  # add_observer
        self._cond = threading.Condition()
        self._commands: deque[_Add | _Abort | _Call] = deque()
        self._stopping = False
        self._failure: BaseException | None = None
        self._live: dict[str, _Live] = {}  # engine thread only
        self._stats: dict = engine.stats()  # replaced (never mutated) by the engine thread
        self._stats_at = time.monotonic()  # when _stats was taken
        self._dirty = False  # engine thread: work was done since the last snapshot
        self._thread: threading.Thread | None = None

    # -- facts fixed at load time (safe from any thread) ---------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_family(self) -> str:
        """The model's family name (`wisp.models.families`), e.g. qwen3_moe or gpt_oss."""
        return self.engine.model_config.family

    @property
    def grammars(self) -> "Grammars | None":
        """Compiles requests' grammars (thread-safe: llguidance's tokenizer is shared read-only)."""
        return self.engine.grammars

    @property
    def chat_template(self) -> str | None:
        return self.engine.chat_template

    @property
    def special_tokens(self) -> dict:
        return dict(self.engine.special_tokens)

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """The model's generation_config sampling values (temperature, top_p, top_k) a request that names none
        samples with (`ModelConfig.sampling_defaults`)."""
        return dict(self.engine.model_config.sampling_defaults)

    # -- lifecycle -------------------------------------------------------------------------------------
    def add_observer(self, observer: RequestObserver) -> None:
        """Register before serving starts; observers are called from the engine thread."""
        self._observers.append(observer)

    def start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wisp-engine", daemon=True)
                self._thread.start()

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Abort every request (their streams raise EngineShutDown) and join the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is None:  # never started: only queued admissions to refuse
            self._fail_all(EngineShutDown("the engine is shutting down"))
        elif thread is not threading.current_thread():
            thread.join(timeout)

    def stats(self) -> dict:
        """The last stats snapshot: exact once the engine thread is idle, else as of the last `refresh_stats`
        (or the last time the thread went idle)."""
        return self._stats

    def stats_age(self) -> float:
        """Seconds since the snapshot `stats()` returns was taken."""
        return time.monotonic() - self._stats_at

    async def refresh_stats(self, timeout: float = STATS_TIMEOUT_S) -> dict:
        """A fresh snapshot, taken by the engine thread after the step in progress; after `timeout` seconds
        (a long step), or if the thread is not running, the last snapshot instead (see `stats_age`)."""
        if not self.healthy:
            return self._stats
        try:
            return await self.call(self._snapshot, timeout)
        except (asyncio.TimeoutError, EngineShutDown):
            return self._stats

    async def call(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Any:
        """Run `fn(engine)` on the engine thread between two steps (after the commands posted before it) and
        return its result or raise its exception; EngineShutDown if the engine stops first. After `timeout`
        seconds asyncio.TimeoutError is raised, but `fn` still runs when its turn comes."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._post(_Call(fn, done))
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), timeout)

    # -- requests ------------------------------------------------------------------------------------
    async def submit(self, request_id: str, prompt_ids: list[int], params: "SamplingParams",
                     constraint: "TokenConstraint | None" = None) -> RequestStream:
        """Admit a request into the engine (`constraint`: its grammar); raises what `add_request` raised (WispError)
        or EngineShutDown."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        live = _Live(loop, queue, time.perf_counter(), len(prompt_ids))
        admitted = loop.create_future()
        self._post(_Add(request_id, list(prompt_ids), params, live, admitted, constraint))
        try:
            await admitted
        except asyncio.CancelledError:
            self.abort(request_id)  # posted after the add, so it undoes it
            raise
        return RequestStream(self, request_id, queue)

    async def generate(self, request_id: str, prompt_ids: list[int], params: "SamplingParams") -> AsyncIterator["StepOutput"]:
        """Outputs of one request as the engine produces them; stopping early aborts it."""
        stream = await self.submit(request_id, prompt_ids, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        """Thread-safe; aborting a finished or unknown request does nothing."""
        self._post(_Abort(request_id))

    def _post(self, command: _Add | _Abort | _Call) -> None:
        with self._cond:
            if self._stopping or self._failure is not None:
                if isinstance(command, (_Add, _Call)):
                    _refuse(command)
                return
            self._commands.append(command)
            self._cond.notify()

    # -- the engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.no_grad():
                self._loop()
        except BaseException as exc:  # a bug in the engine: fail every request rather than hang them
            log.exception("engine thread failed")
            with self._cond:
                self._failure = exc
            self._fail_all(EngineShutDown(f"the engine failed: {exc!r}"))
        else:
            self._fail_all(EngineShutDown("the engine is shutting down"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._commands and not self._stopping and not self.engine.has_unfinished():
                    self._cond.wait()
                commands = list(self._commands)
                self._commands.clear()
                stopping = self._stopping
            for command in commands:
                if stopping and isinstance(command, (_Add, _Call)):
                    _refuse(command)
                elif isinstance(command, _Add):
                    self._admit(command)
                    self._dirty = True
                elif isinstance(command, _Call):
                    self._call(command)
                else:
                    self._abort(command.request_id, "abort")
                    self._dirty = True
            if stopping:
                return
            if self.engine.has_unfinished():
                self._dirty = True
                if not self._step():
                    with self._cond:  # work exists but nothing could be scheduled: don't spin on it
                        self._cond.wait(0.001)
            if self._dirty and not self.engine.has_unfinished():  # going idle: one snapshot, so stats() is
                self._snapshot(self.engine)  # exact while nothing runs (never one per step)

    def _snapshot(self, engine: "LLMEngine") -> dict:
        """Engine thread: read the engine's stats (one host read of the device counters) into the snapshot."""
        self._stats, self._stats_at, self._dirty = engine.stats(), time.monotonic(), False
        return self._stats

    def _call(self, cmd: _Call) -> None:
        if not cmd.done.set_running_or_notify_cancel():
            return
        self._dirty = True  # it may change what stats say (a resize); a snapshot call clears it again
        try:
            result = cmd.fn(self.engine)
        except Exception as exc:
            cmd.done.set_exception(exc)
        else:
            cmd.done.set_result(result)

    def _admit(self, cmd: _Add) -> None:
        if cmd.request_id in self._live:
            _settle(cmd.admitted, WispError(f"request id {cmd.request_id!r} is already running"))
            return
        try:
            self.engine.add_request(cmd.request_id, cmd.prompt_ids, cmd.params, constraint=cmd.constraint)
        except Exception as exc:
            _settle(cmd.admitted, exc)
            return
        self._live[cmd.request_id] = cmd.live
        _settle(cmd.admitted, None)

    def _abort(self, request_id: str, reason: str) -> None:
        live = self._live.pop(request_id, None)
        self.engine.abort_request(request_id)
        if live is not None:
            for obs in self._observers:
                obs.observe_finished(reason, live.prompt_tokens, live.completion_tokens)

    def _step(self) -> bool:
        """One engine step, its outputs dispatched; returns whether it computed anything (a prefill chunk
        short of its prompt's end computes tokens but has no output)."""
        done_before = self.engine.tokens_prefilled + self.engine.tokens_decoded
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._step_failed(exc)
            return False
        now = time.perf_counter()
        for out in outputs:
            self._dispatch(out, now)
        return bool(outputs) or self.engine.tokens_prefilled + self.engine.tokens_decoded != done_before

    def _step_failed(self, exc: Exception) -> None:
        """Abort every live request with the error; re-raise if the engine still holds work (a bug)."""
        log.exception("engine step failed; aborting its requests")
        error = EngineShutDown(f"the engine step failed: {exc!r}")
        for request_id, live in list(self._live.items()):
            self._abort(request_id, "error")
            live.put(error)
        if self.engine.has_unfinished():
            raise exc

    def _dispatch(self, out: "StepOutput", now: float) -> None:
        live = self._live.get(out.request_id)
        if live is None:  # aborted by its consumer after this step was scheduled
            return
        self._observe(live, out, now)
        if out.finished:
            del self._live[out.request_id]
            for obs in self._observers:
                obs.observe_finished(out.finish_reason or "stop", out.prompt_tokens, len(out.token_ids))
            if out.finish_reason == FINISH_REASON:
                live.put(RequestFailed(out.error or f"request {out.request_id} failed"))
                return
        live.put(out)

    def _observe(self, live: _Live, out: "StepOutput", now: float) -> None:
        n = len(out.new_token_ids)
        if n == 0:
            return
        live.completion_tokens += n
        if live.last_token_time is None:  # TTFT: arrival (submit) to the first token
            for obs in self._observers:
                obs.observe_ttft(now - live.arrival)
        else:  # a step that brought n tokens counts n gaps of equal length
            gap = (now - live.last_token_time) / n
            for _ in range(n):
                for obs in self._observers:
                    obs.observe_inter_token(gap)
        live.last_token_time = now

    def _fail_all(self, error: BaseException) -> None:
        """On thread exit: abort what is live (best effort) and wake every waiting consumer."""
        with self._cond:
            self._stopping = True
            pending = list(self._commands)
            self._commands.clear()
        for cmd in pending:
            if isinstance(cmd, (_Add, _Call)):
                _refuse(cmd, error)
        for request_id, live in list(self._live.items()):
            try:
                self._abort(request_id, "abort")
            except Exception:
                log.exception("aborting %s during shutdown failed", request_id)
                self._live.pop(request_id, None)
            live.put(error)
        try:
            self._snapshot(self.engine)
        except Exception:
            pass
