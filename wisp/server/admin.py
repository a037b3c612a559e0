"""A debug route that resizes the engine's pools while it serves: `POST /admin/resize`.

Mounted only by `wisp serve --enable-resize-endpoint` (for soak tests and experiments, never by default), and
left out of the OpenAPI document. Body: `{"expert_cap": C, "kv_blocks": N}`, either optional (left out: keep
the current size). It runs `LLMEngine.apply_plan([C] * moe_layers, N)` on the engine thread between two steps
(`AsyncEngine.call`), requests running or not; with only `kv_blocks` (any mode) `resize_kv`. Answers the new
sizes and how long the resize held the engine. A size the engine refuses (a cap outside top_k..num_experts, KV
blocks under the admission floor, a cap in a mode without expert slots: not paged, nor hybrid with slots) is a 400 and changes nothing. With
`--api-key` the route needs the bearer key too.
"""

from __future__ import annotations

import hmac
import time

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from wisp.engine.async_engine import AsyncEngine
from wisp.server.protocol import APIError

RESIZE_TIMEOUT_S = 120.0


class ResizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expert_cap: int | None = Field(default=None, ge=1)
    kv_blocks: int | None = Field(default=None, ge=1)


def add_resize_route(app: FastAPI, engine: AsyncEngine, api_key: str | None = None) -> None:
    """Mount POST /admin/resize on `app` (see the module docstring)."""

    @app.post("/admin/resize", include_in_schema=False)
    async def resize(req: ResizeRequest, request: Request):
        if api_key and not _authorized(request, api_key):
            raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key")
        return await engine.call(lambda e: _resize(e, req.expert_cap, req.kv_blocks), RESIZE_TIMEOUT_S)


def _authorized(request: Request, api_key: str) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def _resize(engine, expert_cap: int | None, kv_blocks: int | None) -> dict:
    """Engine thread: resize, then report the sizes in force."""
    start = time.perf_counter()
    blocks = kv_blocks if kv_blocks is not None else engine.pool.num_blocks
    timings = None
    if expert_cap is not None:
        timings = engine.apply_plan([expert_cap] * len(engine.model_config.moe_layer_ids), blocks)
    elif kv_blocks is not None:
        engine.resize_kv(blocks)
    out = {"expert_cap": engine.expert_cap, "kv_blocks": engine.pool.num_blocks,
           "stall_s": time.perf_counter() - start}
    if timings is not None:
        out.update(kv_s=timings.kv_s, experts_s=timings.experts_s, graphs_s=timings.graphs_s)
    return out
