"""Engine outputs -> OpenAI server-sent-event streams, one request's choices interleaved (`wisp.server.choices`).

Per choice, a `ChoiceStream` turns each output into the chunk that carries what is new: text, the tokens' logprobs,
and (chat with tools) tool-call deltas in OpenAI's shape, then the finish reason.

Invariants:
- Streamed text is append-only: while a request runs, `TextDeltas` holds back the tail that could
  still become a stop string (which the engine would cut) and a trailing U+FFFD (an incomplete UTF-8
  character), so no chunk ever has to be retracted; a tool-call format holds back what could still open a call.
- Each token's logprobs are sent once, in the chunk of the output that produced the token.
- However a response ends (finished, client gone, task cancelled, engine shut down), every choice's
  stream is closed, which aborts it in the engine if it had not finished.
- An SSE stream always ends with `data: [DONE]` unless the client went away; a request that failed
  (alone: `RequestFailed`, or with the engine: `EngineShutDown`) sends an error event before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AsyncIterator

from pydantic import BaseModel

from wisp.engine.async_engine import EngineShutDown, RequestFailed
from wisp.errors import WispError
from wisp.server.choices import Choices
from wisp.server.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from wisp.server.protocol import REQUEST_FAILED, ErrorInfo, ErrorResponse
from wisp.server.responses import (
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, Completion, CompletionChoice, FunctionCallDelta, ToolCallDelta,
    Usage,
)

if TYPE_CHECKING:
    from wisp.engine.engine import StepOutput
    from wisp.server.tool_calls import ToolCallFormat


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


class ChoiceStream:
    """One choice's new text and logprob entries per output."""

    def __init__(self, stop: tuple[str, ...]):
        self.text = TextDeltas(stop)
        self.logprobs_sent = 0

    def step(self, out: "StepOutput") -> tuple[str, list]:
        entries = out.logprobs[self.logprobs_sent:] if out.logprobs is not None else []
        self.logprobs_sent += len(entries)
        return self.text.next(out), entries


class CompletionChunks:
    """/v1/completions chunks; with `echo` each choice's first chunk carries the prompt text (and its logprobs)."""

    def __init__(self, head: dict, choices: int, stop: tuple[str, ...], texts: TokenTexts, want_logprobs: bool,
                 echo: tuple[str, list[int], list] | None = None):
        self.head, self.texts, self.want_logprobs, self.echo = head, texts, want_logprobs, echo
        self.streams = [ChoiceStream(stop) for _ in range(choices)]
        self.offsets = [0] * choices
        self.started = [False] * choices

    def start(self) -> list[BaseModel]:
        return []

    def _logprobs(self, index: int, tokens: list[int], entries: list):
        if not self.want_logprobs:
            return None
        out = completion_logprobs(entries, tokens, self.texts, self.offsets[index])
        self.offsets[index] += sum(len(t) for t in out.tokens)
        return out

    def chunks(self, index: int, out: "StepOutput") -> list[BaseModel]:
        chunks = []
        if not self.started[index] and self.echo is not None:
            text, ids, entries = self.echo
            chunks.append(self._chunk(index, text, self._logprobs(index, ids, entries), None))
        self.started[index] = True
        delta, entries = self.streams[index].step(out)
        if delta or entries or out.finished:
            tokens = out.token_ids[len(out.token_ids) - len(entries):] if entries else []
            chunks.append(self._chunk(index, delta, self._logprobs(index, tokens, entries) if entries else None,
                                      out.finish_reason if out.finished else None))
        return chunks

    def _chunk(self, index, text, logprobs, finish_reason) -> BaseModel:
        return Completion(**self.head, choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                                                 finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return Completion(**self.head, choices=[], usage=usage)


class ChatChunks:
    """/v1/chat/completions chunks: the role first, then content (or, with tools, content and tool-call deltas)."""

    def __init__(self, head: dict, choices: int, stop: tuple[str, ...], texts: TokenTexts, want_logprobs: bool,
                 tool_format: "ToolCallFormat | None" = None):
        self.head, self.texts, self.want_logprobs = head, texts, want_logprobs
        self.streams = [ChoiceStream(stop) for _ in range(choices)]
        self.tools = [tool_format.streamer() if tool_format is not None else None for _ in range(choices)]
        self.called = [False] * choices

    def start(self) -> list[BaseModel]:
        return [self._chunk(i, ChatDelta(role="assistant", content="")) for i in range(len(self.streams))]

    def chunks(self, index: int, out: "StepOutput") -> list[BaseModel]:
        text, entries = self.streams[index].step(out)
        logprobs = chat_logprobs(entries, self.texts) if self.want_logprobs and entries else None
        deltas = [ChatDelta(content=text)] if text else []
        if self.tools[index] is not None:
            events = self.tools[index].feed(text) + (self.tools[index].finish() if out.finished else [])
            deltas = [self._delta(index, e) for e in events]
        chunks = [self._chunk(index, d) for d in deltas]
        if logprobs is not None:  # the tokens' logprobs ride on the output's first chunk (an empty delta if none)
            chunks = chunks or [self._chunk(index, ChatDelta())]
            chunks[0].choices[0].logprobs = logprobs
        if out.finished:
            reason = "tool_calls" if self.called[index] and out.finish_reason == "stop" else out.finish_reason
            chunks.append(self._chunk(index, ChatDelta(), reason))
        return chunks

    def _delta(self, index: int, event) -> ChatDelta:
        if event.content is not None:
            return ChatDelta(content=event.content)
        self.called[index] = True
        call = event.call
        return ChatDelta(tool_calls=[ToolCallDelta(index=call.index, id=call.id, type="function" if call.id else None,
                                                   function=FunctionCallDelta(name=call.name,
                                                                              arguments=call.arguments))])

    def _chunk(self, index: int, delta: ChatDelta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self.head, choices=[ChatChunkChoice(index=index, delta=delta,
                                                                         finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return ChatCompletionChunk(**self.head, choices=[], usage=usage)


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


async def sse_events(choices: Choices, fmt, include_usage: bool, prompt_tokens: int) -> AsyncIterator[str]:
    completion_tokens: dict[int, int] = {}
    try:
        for chunk in fmt.start():
            yield sse(chunk)
        async for index, out in choices.outputs():
            completion_tokens[index] = len(out.token_ids)
            for chunk in fmt.chunks(index, out):
                yield sse(chunk)
        if include_usage:
            yield sse(fmt.usage(Usage.of(prompt_tokens, sum(completion_tokens.values()))))
    except EngineShutDown as exc:
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code="engine_unavailable")))
    except RequestFailed as exc:
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="server_error", code=REQUEST_FAILED)))
    except WispError as exc:  # a later choice refused at submission (the first one was admitted before the stream)
        yield sse(ErrorResponse(error=ErrorInfo(message=str(exc), type="invalid_request_error")))
    finally:
        choices.close()
    yield sse("[DONE]")
