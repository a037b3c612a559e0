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
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from wisp.engine.async_engine import AsyncEngine, EngineShutDown, RequestFailed
from wisp.errors import InvalidParameter, WispError
from wisp.server.chat_template import ChatTemplate
from wisp.server.guards import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, ErrorBoundary, error_response
from wisp.server.metrics import ServerMetrics
from wisp.server.openapi import HealthStatus, errors, install as install_openapi, prometheus_text, streamed
from wisp.server.choices import ClientGone
from wisp.server.generation import Generator
from wisp.server.prompt_encoder import PromptEncoder
from wisp.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, ErrorInfo, REQUEST_FAILED
from wisp.server.responses import ChatCompletion, Completion, ModelCard, ModelList, now


TOKENIZER_THREADS = 2  # prompts rendered (chat templates) and encoded at once; more wait their turn (off the loop)
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
_GENERATION_ERRORS = errors(400, 404, 413, 500, 503)  # and 401 with an API key (openapi.install adds it)


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
    generator = Generator(engine, served_model_name, ChatTemplate(engine.chat_template, engine.special_tokens),
                          render_pool, encoder, engine.model_family)
    app = FastAPI(title="wisp", lifespan=_lifespan(engine, render_pool, encoder, generator), docs_url=None,
                  redoc_url=None)
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


def _lifespan(engine: AsyncEngine, render_pool: ThreadPoolExecutor, encoder: PromptEncoder, generator: Generator):
    """Start the engine thread (and the prompt encoder's workers) with the app; on shutdown abort what is left
    and join it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            await asyncio.to_thread(encoder.warm_up)
            await asyncio.to_thread(generator.warm_up)
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


def _add_generation_routes(app: FastAPI, generator: Generator) -> None:
    """POST /v1/completions and /v1/chat/completions."""

    @app.post("/v1/completions", responses={**streamed(Completion, "completion"), **_GENERATION_ERRORS})
    async def completions(req: CompletionRequest, request: Request):
        generator.check_model(req.model)
        if isinstance(req.prompt, str):
            prompt_ids = await generator.encode(lambda: req.prompt, "prompt")
            prompt_text = req.prompt
        else:
            prompt_ids, prompt_text = generator.check_prompt_ids(list(req.prompt)), None
        return await generator.generate(req, request, prompt_ids, "prompt", prompt_text)

    @app.post("/v1/chat/completions", responses={**streamed(ChatCompletion, "chat completion"),
                                                  **_GENERATION_ERRORS})
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        generator.check_model(req.model)
        messages = [m.template_dict() for m in req.messages]
        prompt_ids = await generator.encode(lambda: generator.render_chat(messages, req.tool_dicts()), "messages")
        return await generator.generate(req, request, prompt_ids, "messages")
