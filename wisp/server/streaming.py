"""Engine outputs -> OpenAI responses: server-sent-event streams and whole (non-streamed) results.

Invariants:
- Streamed text is append-only: while a request runs, `TextDeltas` holds back the tail that could
  still become a stop string (which the engine would cut) and a trailing U+FFFD (an incomplete UTF-8
  character), so no chunk ever has to be retracted.
- However a response ends (finished, client gone, task cancelled, engine shut down), the request's
  stream is closed, which aborts it in the engine if it had not finished.
- An SSE stream always ends with `data: [DONE]` unless the client went away; a request that failed
  (alone: `RequestFailed`, or with the engine: `EngineShutDown`) sends an error event before it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator, Protocol

from pydantic import BaseModel
from starlette.requests import Request

from wisp.engine.async_engine import EngineShutDown, RequestFailed, RequestStream
from wisp.server.protocol import REQUEST_FAILED, ErrorInfo, ErrorResponse
from wisp.server.responses import ChatChunkChoice, ChatCompletionChunk, ChatDelta, Completion, CompletionChoice, Usage

if TYPE_CHECKING:
    from wisp.engine.engine import StepOutput


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) response was ready."""


class TextDeltas:
    def __init__(self, stop: tuple[str, ...]):
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def next(self, out: "StepOutput") -> str:
        text = out.text
        if not out.finished:
            text = text[: len(text) - self._hold] if self._hold else text
            text = text.rstrip("\ufffd")
        if not text.startswith(self.sent):  # the decoder revised earlier text: wait for it to settle
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


class ChunkFormat(Protocol):
    def start(self) -> list[BaseModel]: ...

    def chunk(self, delta: str, finish_reason: str | None) -> BaseModel: ...

    def usage(self, usage: Usage) -> BaseModel: ...


class CompletionChunks:
    def __init__(self, request_id: str, created: int, model: str):
        self.head = dict(id=request_id, created=created, model=model)

    def start(self) -> list[BaseModel]:
        return []

    def chunk(self, delta: str, finish_reason: str | None) -> BaseModel:
        return Completion(**self.head, choices=[CompletionChoice(text=delta, finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return Completion(**self.head, choices=[], usage=usage)


class ChatChunks:
    def __init__(self, request_id: str, created: int, model: str):
        self.head = dict(id=request_id, created=created, model=model)

    def start(self) -> list[BaseModel]:
        return [ChatCompletionChunk(**self.head, choices=[ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])]

    def chunk(self, delta: str, finish_reason: str | None) -> BaseModel:
        content = delta if delta or finish_reason is None else None
        return ChatCompletionChunk(**self.head, choices=[ChatChunkChoice(delta=ChatDelta(content=content),
                                                                          finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return ChatCompletionChunk(**self.head, choices=[], usage=usage)


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


async def sse_events(stream: RequestStream, fmt: ChunkFormat, stop: tuple[str, ...], include_usage: bool,
                     prompt_tokens: int) -> AsyncIterator[str]:
    deltas = TextDeltas(stop)
    completion_tokens = 0
    try:
        for chunk in fmt.start():
            yield sse(chunk)
        async for out in stream:
            completion_tokens = len(out.token_ids)
            delta = deltas.next(out)
            if delta or out.finished:
                yield sse(fmt.chunk(delta, out.finish_reason if out.finished else None))
        if include_usage:
            yield sse(fmt.usage(Usage.of(prompt_tokens, completion_tokens)))
    except EngineShutDown as exc:
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code="engine_unavailable")))
    except RequestFailed as exc:
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code=REQUEST_FAILED)))
    finally:
        stream.close()
    yield sse("[DONE]")


async def _last_output(stream: RequestStream) -> "StepOutput":
    last = None
    async for out in stream:
        last = out
    assert last is not None and last.finished
    return last


async def _disconnected(request: Request) -> None:
    # the body has been read, so the next ASGI message is the disconnect (or never comes)
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def final_output(stream: RequestStream, request: Request) -> "StepOutput":
    """The request's finished output; aborts it and raises ClientGone if the client leaves first."""
    consume = asyncio.ensure_future(_last_output(stream))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({consume, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not consume.done():
            consume.cancel()
        stream.close()
    if consume.done() and not consume.cancelled():
        return consume.result()
    raise ClientGone()
