"""The n choices of one request (OpenAI's `n`), each its own engine request, merged into one stream of outputs.

Choice 0 is submitted first; the others once its first output has come, that is once its prompt is in the KV cache,
so they find the prompt's full blocks in the prefix cache instead of computing them again. Each choice samples with
its own seed (`_SamplingRequest.sampling_params`): a request's choices are reproducible and differ from each other.

Invariants:
- However the consumer stops (finished, client gone, cancelled, an error), `close` closes every submitted choice's
  stream, which aborts it in the engine if it had not finished.
- An engine error of one choice (`RequestFailed`, `EngineShutDown`) or a refusal of a later choice at submission is
  raised to the consumer in order with the outputs, after what was already produced.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

from starlette.requests import Request

if TYPE_CHECKING:
    from wisp.engine.async_engine import AsyncEngine, RequestStream
    from wisp.engine.engine import StepOutput

_END = object()


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) response was ready."""


class Choices:
    def __init__(self, engine: "AsyncEngine", request_id: str, prompt_ids: list[int], params: list, constraints: list):
        self.engine, self.request_id, self.prompt_ids = engine, request_id, prompt_ids
        self.params, self.constraints = params, constraints
        self.streams: list["RequestStream"] = []

    def engine_id(self, index: int) -> str:
        return self.request_id if index == 0 else f"{self.request_id}-{index}"

    async def submit_first(self) -> None:
        """Admit choice 0 (what the engine refuses, WispError, is raised here, before any response starts)."""
        self.streams.append(await self._submit(0))

    async def _submit(self, index: int) -> "RequestStream":
        return await self.engine.submit(self.engine_id(index), self.prompt_ids, self.params[index],
                                        self.constraints[index])

    async def outputs(self) -> AsyncIterator[tuple[int, "StepOutput"]]:
        """(choice index, output) as the engine produces them, choices interleaved."""
        queue: asyncio.Queue = asyncio.Queue()
        pumps: list[asyncio.Task] = []
        first_seen = asyncio.Event()

        async def pump(index: int, stream: "RequestStream") -> None:
            try:
                async for out in stream:
                    first_seen.set()
                    await queue.put((index, out))
            except BaseException as exc:  # noqa: BLE001 (handed to the consumer)
                await queue.put((index, exc))
            finally:
                first_seen.set()
                await queue.put((index, _END))

        async def submit_rest() -> None:
            await first_seen.wait()
            for index in range(1, len(self.params)):
                try:
                    stream = await self._submit(index)
                except BaseException as exc:  # noqa: BLE001
                    await queue.put((index, exc))
                    await queue.put((index, _END))
                    continue
                self.streams.append(stream)
                pumps.append(asyncio.ensure_future(pump(index, stream)))

        pumps.append(asyncio.ensure_future(pump(0, self.streams[0])))
        submitter = asyncio.ensure_future(submit_rest())
        open_choices = len(self.params)
        try:
            while open_choices:
                index, item = await queue.get()
                if item is _END:
                    open_choices -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            submitter.cancel()
            for task in pumps:
                task.cancel()
            self.close()

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    async def final(self, request: Request) -> list["StepOutput"]:
        """Every choice's finished output; aborts them all and raises ClientGone if the client leaves first."""
        last: dict[int, "StepOutput"] = {}

        async def consume() -> None:
            async for index, out in self.outputs():
                last[index] = out

        work = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
            self.close()
        if work.done() and not work.cancelled():
            work.result()  # raises what a choice raised
            return [last[i] for i in range(len(self.params))]
        raise ClientGone()


async def _disconnected(request: Request) -> None:
    # the body has been read, so the next ASGI message is the disconnect (or never comes)
    while (await request.receive())["type"] != "http.disconnect":
        pass
