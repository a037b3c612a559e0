"""What the two generation routes share: the model-name check, prompt rendering and encoding (off the event loop),
the request's grammar, its n choices in the engine, and the response (streamed as server-sent events, or whole).

Invariants:
- Everything a client can get wrong is refused (a 400 naming the field) before the first choice reaches the engine:
  the prompt's length, sampling values, a grammar that does not compile.
- Tool calls are parsed out of a reply only when the request gave tools and did not say tool_choice "none"; a reply
  with calls finishes with "tool_calls" (unless it ran out of tokens: "length").
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor

from fastapi import Request
from fastapi.responses import StreamingResponse

from wisp.engine.async_engine import AsyncEngine
from wisp.errors import WispError
from wisp.server.chat_template import ChatTemplate
from wisp.server.choices import Choices
from wisp.server.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from wisp.server.output_constraints import compile_constraints, grammar_for
from wisp.server.prompt_encoder import PromptEncoder, TooLong
from wisp.server.protocol import APIError, ChatCompletionRequest, CompletionRequest
from wisp.server.responses import (
    AssistantMessage, ChatChoice, ChatCompletion, Completion, CompletionChoice, FunctionCall, ToolCallOut, Usage,
    new_id, now,
)
from wisp.server.streaming import ChatChunks, CompletionChunks, sse_events
from wisp.server.tool_calls import tool_call_format_for
from wisp.server.wire_types import unencodable_at

log = logging.getLogger("wisp.server")
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs", "logit_bias",
                    "presence_penalty", "frequency_penalty")


def length_param(req) -> str:
    """The field a request set its completion length with (chat requests have two names for it)."""
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"


def max_tokens_for(req, prompt_len: int, limit: int, default: int | None, prompt_param: str) -> int:
    """The completion length of a request: its own max_tokens, else `default` (None: the rest of the
    context), capped by the context; a request past the `limit` of prompt + completion is a 400."""
    if prompt_len == 0:
        raise APIError(400, "the prompt is empty (it encodes to no tokens)", param=prompt_param)
    requested = req.requested_max_tokens()
    max_tokens = requested if requested is not None else max(1, limit - prompt_len if default is None
                                                              else min(default, limit - prompt_len))
    if prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). "
            "Please reduce the length of the prompt or max_tokens.",
            param=length_param(req) if requested is not None else prompt_param,
            code="context_length_exceeded",
        )
    return max_tokens


def too_long(prompt_len: int, limit: int, param: str, at_least: bool = False) -> APIError:
    """The prompt alone fills the context (checked before any other work on the request); `at_least`: it was
    counted only until that was certain."""
    has = f"at least {prompt_len}" if at_least else f"{prompt_len}"
    return APIError(400, f"This model's maximum context length is {limit} tokens. However, the prompt alone has "
                         f"{has} tokens ({has} in the prompt, at least 1 needed for the completion). "
                         "Please reduce the length of the prompt.", param=param, code="context_length_exceeded")


def param_of(message: str, fields: tuple[str, ...], default: str | None) -> str | None:
    """The request field an engine-side error message is about: the first of `fields` it names."""
    named = [(m.start(), f) for f in fields if (m := re.search(rf"\b{f}\b", message))]
    return min(named)[1] if named else default


class Generator:
    def __init__(self, engine: AsyncEngine, served_model_name: str, chat_template: ChatTemplate,
                 render_pool: ThreadPoolExecutor, encoder: PromptEncoder, model_type: str = ""):
        self.engine = engine
        self.served_model_name = served_model_name
        self.chat_template = chat_template
        self.render_pool, self.encoder = render_pool, encoder
        self.tool_format = tool_call_format_for(model_type)
        self.sampling_defaults = engine.sampling_defaults  # the model's generation_config: what a request leaves out
        grammars = engine.grammars
        self.texts = TokenTexts(grammars.token_bytes if grammars is not None else None,
                                engine.tokenizer.decode if engine.tokenizer is not None else None)

    def warm_up(self) -> None:
        """Build what the first constrained or logprobs request would otherwise wait for (llguidance's tokenizer).
        A tokenizer llguidance cannot read is logged: the server still starts, and constrained requests get a 400."""
        if self.engine.grammars is not None:
            try:
                self.engine.grammars.tokenizer
            except WispError as exc:
                log.warning("constrained output is unavailable: %s", exc)

    def check_model(self, name: str) -> None:
        if name != self.served_model_name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.served_model_name}`.",
                           param="model", code="model_not_found")

    def check_prompt_ids(self, prompt_ids: list[int]) -> list[int]:
        if len(prompt_ids) >= self.engine.max_model_len:
            raise too_long(len(prompt_ids), self.engine.max_model_len, "prompt")
        return prompt_ids

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        try:
            return self.chat_template.render(messages, tools)
        except WispError as exc:
            raise APIError(400, str(exc), param="messages") from None

    async def encode(self, text_of, field: str) -> list[int]:
        """Token ids of the text `text_of()` makes (the prompt, or the rendered chat: rendered on a thread, encoded
        by the prompt encoder, `wisp.server.prompt_encoder`); a 400 naming `field` if it cannot be encoded or
        leaves no room for a completion."""
        if self.engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer.json: send the prompt as a list of token ids", param=field)

        def render() -> str:
            text = text_of()
            if unencodable_at(text) is not None:  # a template can quote what validation let through (e.g. a key)
                raise APIError(400, f"{field}: the text holds a lone UTF-16 surrogate, which is not valid Unicode",
                               param=field)
            return text

        limit = self.engine.max_model_len
        text = await asyncio.get_running_loop().run_in_executor(self.render_pool, render)
        encoded = await self.encoder.encode(text, limit)
        if isinstance(encoded, TooLong):
            raise too_long(encoded.at_least, limit, field, at_least=True)
        if len(encoded) >= limit:
            raise too_long(len(encoded), limit, field)
        return encoded

    async def generate(self, req, request: Request, prompt_ids: list[int], field: str, prompt_text: str | None = None):
        """Submit one request's choices; stream them as SSE, or wait and return the whole response. The engine's own
        refusals (WispError) become 400s naming the field they are about."""
        chat = isinstance(req, ChatCompletionRequest)
        limit = self.engine.max_model_len
        max_tokens = max_tokens_for(req, len(prompt_ids), limit, None if chat else DEFAULT_COMPLETION_TOKENS, field)
        tool_format = self.tool_format if chat and req.uses_tools else None
        try:
            params = [req.sampling_params(max_tokens, i, self.sampling_defaults) for i in range(req.choices)]
            if tool_format is not None and tool_format.keeps_special_tokens:
                params = [replace(p, skip_special_tokens=False) for p in params]
        except WispError as exc:
            param = param_of(str(exc), _SAMPLING_FIELDS, None)
            raise APIError(400, str(exc), param=length_param(req) if param == "max_tokens" else param) from None
        loop = asyncio.get_running_loop()
        constraints = await loop.run_in_executor(
            self.render_pool, lambda: compile_constraints(self.engine.grammars, grammar_for(req, tool_format),
                                                          req.choices))
        echo = await self._echo(req, prompt_ids, prompt_text) if not chat and req.echo else None
        request_id = new_id("chatcmpl" if chat else "cmpl")
        choices = Choices(self.engine, request_id, prompt_ids, params, constraints)
        try:
            await choices.submit_first()
        except WispError as exc:  # the engine's prompt checks (vocabulary, length); max_tokens if it says so
            param = param_of(str(exc), ("max_tokens", "logit_bias"), field)
            raise APIError(400, str(exc), param=length_param(req) if param == "max_tokens" else param) from None
        want_logprobs = params[0].logprobs is not None
        if req.stream:
            head = dict(id=request_id, created=now(), model=self.served_model_name)
            fmt = (ChatChunks(head, req.choices, req.stop_strings, self.texts, want_logprobs, tool_format) if chat
                   else CompletionChunks(head, req.choices, req.stop_strings, self.texts, want_logprobs, echo))
            events = sse_events(choices, fmt, req.include_usage, len(prompt_ids))
            return StreamingResponse(events, media_type="text/event-stream")
        outs = await choices.final(request)
        usage = Usage.of(len(prompt_ids), sum(len(o.token_ids) for o in outs))
        if chat:
            return ChatCompletion(id=request_id, created=now(), model=self.served_model_name, usage=usage,
                                  choices=[self._chat_choice(i, o, want_logprobs, tool_format) for i, o in enumerate(outs)])
        return Completion(id=request_id, created=now(), model=self.served_model_name, usage=usage,
                          choices=[self._completion_choice(i, o, want_logprobs, echo) for i, o in enumerate(outs)])

    async def _echo(self, req: CompletionRequest, prompt_ids: list[int], prompt_text: str | None):
        """(text, ids, logprob entries) of the prompt a completion echoes; the entries only when logprobs are asked
        for (a teacher-forced pass over the prompt, on the engine thread between steps)."""
        text = prompt_text if prompt_text is not None else self.engine.tokenizer.decode(prompt_ids) \
            if self.engine.tokenizer is not None else ""
        entries = [None] * len(prompt_ids)
        if req.logprobs is not None:
            try:
                entries = await self.engine.call(lambda engine: engine.prompt_logprobs(prompt_ids, req.logprobs))
            except WispError as exc:
                raise APIError(400, f"echo with logprobs: {exc}", param="echo") from None
        return text, prompt_ids, entries

    def _chat_choice(self, index: int, out, want_logprobs: bool, tool_format) -> ChatChoice:
        content, calls, reason = out.text, None, out.finish_reason
        if tool_format is not None:
            parsed = tool_format.parse(out.text)
            content = parsed.content
            if parsed.tool_calls:
                calls = [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                         for c in parsed.tool_calls]
                reason = "tool_calls" if reason == "stop" else reason
        logprobs = chat_logprobs(out.logprobs or [], self.texts) if want_logprobs else None
        return ChatChoice(index=index, message=AssistantMessage(content=content, tool_calls=calls),
                          logprobs=logprobs, finish_reason=reason)

    def _completion_choice(self, index: int, out, want_logprobs: bool, echo) -> CompletionChoice:
        text, logprobs = out.text, None
        if want_logprobs:
            tokens, entries = list(out.token_ids), list(out.logprobs or [])
            if echo is not None:
                tokens, entries = list(echo[1]) + tokens, list(echo[2]) + entries
            logprobs = completion_logprobs(entries, tokens, self.texts)
        if echo is not None:
            text = echo[0] + text
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=out.finish_reason)
