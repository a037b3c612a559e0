"""`build_app`: the OpenAI-compatible HTTP API over one `AsyncEngine`.

Routes: GET /health, GET /metrics (Prometheus text), GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (both streamed as server-sent events with `"stream": true`).

Invariants:
- Every error a client can cause is an OpenAI error object ({"error": {message, type, param, code}}):
  bad JSON / wrong types / invalid Unicode / unsupported options / too long -> 400, missing or wrong
  bearer key on /v1 -> 401, unknown model or route -> 404, a body over `max_request_bytes` -> 413,
  engine shutting down -> 503. A 400 about one field names it in `param` (prompt, messages,
  max_tokens, ...); only errors about the body as a whole (not JSON, not an object) leave it null.
- Anything else is a bug: a generic 500 that echoes no exception text and closes the connection
  (`guards.ErrorBoundary`; the traceback goes to the log).
- Prompt text is rendered (chat template) and tokenized on a small thread pool, never on the event
  loop, so a huge prompt cannot stall /health or other streams; its token count is checked against
  max_model_len before the engine sees it (a list of token ids, before anything else).
  A request that failed on its own in the engine (its sampling or stop check: `RequestFailed`) -> 500
  for that request only, code "request_failed", with no internal exception text.
- All state (engine, metrics, chat template, key) lives in `app.state`, the route closures and the
  `_Generator` that `build_app` makes for them; nothing is module-global.
- The lifespan starts the engine thread and, on shutdown, aborts what is left and joins it.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from wisp.engine.async_engine import AsyncEngine, EngineShutDown, RequestFailed
from wisp.errors import InvalidParameter, WispError
from wisp.server.chat_template import ChatTemplate
from wisp.server.guards import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, ErrorBoundary, error_response
from wisp.server.metrics import ServerMetrics
from wisp.server.openapi import HealthStatus, errors, install as install_openapi, prometheus_text, streamed
from wisp.server.prompt_encoder import PromptEncoder, TooLong
from wisp.server.protocol import (
    APIError, ChatCompletionRequest, CompletionRequest, ErrorInfo, REQUEST_FAILED, unencodable_at,
)
from wisp.server.responses import (
    AssistantMessage, ChatChoice, ChatCompletion, Completion, CompletionChoice, ModelCard, ModelList, Usage, new_id, now,
)
from wisp.server.streaming import ChatChunks, ClientGone, CompletionChunks, final_output, sse_events


DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
TOKENIZER_THREADS = 2  # prompts rendered (chat templates) and encoded at once; more wait their turn (off the loop)
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
_GENERATION_ERRORS = errors(400, 404, 413, 500, 503)  # and 401 with an API key (openapi.install adds it)
_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


class BearerAuth:
    """ASGI middleware: /v1/* requires `Authorization: Bearer <key>` (health and metrics stay open)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and not self._authorized(scope):
            info = ErrorInfo(message="Missing or incorrect API key: send 'Authorization: Bearer <key>'.",
                             type="invalid_request_error", code="invalid_api_key")
            await error_response(401, info, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}", None
    parts = [p for p in err["loc"][1:] if isinstance(p, int) or (p.isidentifier() and p not in _TYPE_TAGS)]
    msg = err["msg"].removeprefix("Value error, ")
    where = ".".join(map(str, parts))
    return (f"{where}: {msg}" if where else f"request body: {msg}"), (str(parts[0]) if parts else None)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc.status, exc.info)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        content_type = request.headers.get("content-type", "")
        if param is None and "json" not in content_type:
            message = f"the request body must be JSON sent with Content-Type: application/json (got {content_type!r})"
        return error_response(400, ErrorInfo(message=message, type="invalid_request_error", param=param))

    @app.exception_handler(WispError)
    async def _wisp_error(request: Request, exc: WispError):  # the routes name the field of those they expect
        param = exc.param if isinstance(exc, InvalidParameter) else None
        return error_response(400, ErrorInfo(message=str(exc), type="invalid_request_error", param=param))

    @app.exception_handler(RequestFailed)
    async def _request_failed(request: Request, exc: RequestFailed):
        return error_response(500, ErrorInfo(message=str(exc), type="server_error", code=REQUEST_FAILED))

    @app.exception_handler(EngineShutDown)
    async def _shut_down(request: Request, exc: EngineShutDown):
        return error_response(503, ErrorInfo(message=str(exc), type="server_error", code="engine_unavailable"))

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = str(exc.detail)
        if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's: say why
            message = _unparsable_body(exc.__cause__)
        return error_response(exc.status_code, ErrorInfo(message=message, type=kind), exc.headers)

    # no handler for Exception: guards.ErrorBoundary answers those (a generic 500), and closes the connection


def _unparsable_body(cause: BaseException | None) -> str:
    """What was wrong with a body FastAPI could not parse (its exception, chained as the cause)."""
    if isinstance(cause, RecursionError):
        return "the request body nests JSON arrays or objects too deeply to be parsed"
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not valid UTF-8 (byte {cause.start}); JSON text must be UTF-8"
    return "the request body could not be read as JSON text"


def build_app(engine: AsyncEngine, served_model_name: str, api_key: str | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """The app serving `engine` as `served_model_name` (with `api_key`, /v1 routes need it; a request body
    over `max_request_bytes` is a 413)."""
    metrics = ServerMetrics(engine.stats, engine.stats_age)
    engine.add_observer(metrics)
    render_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="wisp-render")
    encoder = PromptEncoder(engine.tokenizer, TOKENIZER_THREADS)
    generator = _Generator(engine, served_model_name, ChatTemplate(engine.chat_template, engine.special_tokens),
                           render_pool, encoder)
    app = FastAPI(title="wisp", lifespan=_lifespan(engine, render_pool, encoder), docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.served_model_name = served_model_name
    # the last added runs first: the boundary around everything, the key checked before a body is read
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    app.add_middleware(ErrorBoundary)
    _install_error_handlers(app)
    _add_info_routes(app, engine, metrics, served_model_name)
    _add_generation_routes(app, generator)
    install_openapi(app, api_key=bool(api_key))
    return app


def _lifespan(engine: AsyncEngine, render_pool: ThreadPoolExecutor, encoder: PromptEncoder):
    """Start the engine thread (and the prompt encoder's workers) with the app; on shutdown abort what is left
    and join it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            await asyncio.to_thread(encoder.warm_up)
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)
            render_pool.shutdown(wait=False, cancel_futures=True)
            encoder.shutdown()

    return lifespan


def _add_info_routes(app: FastAPI, engine: AsyncEngine, metrics: ServerMetrics, served_model_name: str) -> None:
    """GET /health, /metrics and /v1/models."""
    created = now()

    @app.get("/health", responses={200: {"model": HealthStatus}, **errors(500, 503)})
    async def health():
        if not engine.healthy:
            return error_response(503, ErrorInfo(message="the engine is not running", type="server_error"))
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response, responses={**prometheus_text(), **errors(500)})
    async def prometheus():
        await engine.refresh_stats()  # a snapshot taken now, between steps (see wisp/server/metrics.py)
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", responses=errors(500))
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=served_model_name, created=created, max_model_len=engine.max_model_len)])


def _add_generation_routes(app: FastAPI, generator: "_Generator") -> None:
    """POST /v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions", responses={**streamed(Completion, "completion"), **_GENERATION_ERRORS})
    async def completions(req: CompletionRequest, request: Request):
        generator.check_model(req.model)
        if isinstance(req.prompt, str):
            prompt_ids = await generator.encode(lambda: req.prompt, "prompt")
        else:
            prompt_ids = generator.check_prompt_ids(list(req.prompt))
        return await generator.generate(req, request, prompt_ids, DEFAULT_COMPLETION_TOKENS, "prompt", "cmpl",
                                        CompletionChunks, _completion)

    @app.post("/v1/chat/completions", responses={**streamed(ChatCompletion, "chat completion"),
                                                  **_GENERATION_ERRORS})
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        generator.check_model(req.model)
        messages = [m.template_dict() for m in req.messages]
        prompt_ids = await generator.encode(lambda: generator.render_chat(messages), "messages")
        return await generator.generate(req, request, prompt_ids, None, "messages", "chatcmpl", ChatChunks,
                                        _chat_completion)


def _completion(request_id: str, out, usage: Usage, model: str) -> Completion:
    return Completion(id=request_id, created=now(), model=model, usage=usage,
                      choices=[CompletionChoice(text=out.text, finish_reason=out.finish_reason)])


def _chat_completion(request_id: str, out, usage: Usage, model: str) -> ChatCompletion:
    choice = ChatChoice(message=AssistantMessage(content=out.text), finish_reason=out.finish_reason)
    return ChatCompletion(id=request_id, created=now(), model=model, usage=usage, choices=[choice])


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


class _Generator:
    """What the two generation routes share: the model-name check, prompt encoding (off the event loop),
    and submitting one request to the engine (streamed as server-sent events, or waited for and returned
    whole)."""

    def __init__(self, engine: AsyncEngine, served_model_name: str, chat_template: ChatTemplate,
                 render_pool: ThreadPoolExecutor, encoder: PromptEncoder):
        self.engine = engine
        self.served_model_name = served_model_name
        self.chat_template = chat_template
        self.render_pool, self.encoder = render_pool, encoder

    def check_model(self, name: str) -> None:
        if name != self.served_model_name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.served_model_name}`.",
                           param="model", code="model_not_found")

    def check_prompt_ids(self, prompt_ids: list[int]) -> list[int]:
        if len(prompt_ids) >= self.engine.max_model_len:
            raise too_long(len(prompt_ids), self.engine.max_model_len, "prompt")
        return prompt_ids

    def render_chat(self, messages: list[dict]) -> str:
        try:
            return self.chat_template.render(messages)
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

    async def generate(self, req, request: Request, prompt_ids: list[int], default_max: int | None, field: str,
                       prefix: str, chunks, whole):
        """Submit one request; stream it as SSE through `chunks`, or wait and build `whole(id, output, usage,
        model)`. The engine's own refusals (WispError) become 400s naming the field they are about."""
        limit = self.engine.max_model_len
        max_tokens = max_tokens_for(req, len(prompt_ids), limit, default_max, field)
        try:
            params = req.sampling_params(max_tokens)
        except WispError as exc:
            param = param_of(str(exc), _SAMPLING_FIELDS, None)
            raise APIError(400, str(exc), param=length_param(req) if param == "max_tokens" else param) from None
        request_id = new_id(prefix)
        try:
            stream = await self.engine.submit(request_id, prompt_ids, params)
        except WispError as exc:  # the engine's prompt checks (vocabulary, length); max_tokens if it says so
            param = param_of(str(exc), ("max_tokens",), field)
            raise APIError(400, str(exc), param=length_param(req) if param == "max_tokens" else param) from None
        if req.stream:
            events = sse_events(stream, chunks(request_id, now(), self.served_model_name), req.stop_strings,
                                req.include_usage, len(prompt_ids))
            return StreamingResponse(events, media_type="text/event-stream")
        out = await final_output(stream, request)
        return whole(request_id, out, Usage.of(len(prompt_ids), len(out.token_ids)), self.served_model_name)
