"""`wisp serve --enable-resize-endpoint`: POST /admin/resize runs `apply_plan` on the engine thread, live.

Over the real demo engine in process: a resize between a stream's tokens changes the sizes /metrics shows and
not the stream's text (bit-identical outputs across live resizes); sizes the engine refuses are 400s that
change nothing; the route is absent unless mounted, hidden from the OpenAPI document, and keyed with --api-key.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from wisp.config import EngineConfig
from wisp.engine.async_engine import AsyncEngine
from wisp.engine.engine import LLMEngine
from wisp.server.admin import add_resize_route
from wisp.server.app import build_app

MODEL = "demo"


def serve(device, attention_backend, mode="paged", api_key=None, mount=True) -> tuple[TestClient, LLMEngine]:
    llm_engine = LLMEngine(EngineConfig(model=MODEL, device=device, mode=mode, expert_cap=8 if mode == "paged" else None,
                                        max_model_len=128, max_concurrency=2, attention_backend=attention_backend))
    engine = AsyncEngine(llm_engine)
    app = build_app(engine, MODEL, api_key=api_key)
    if mount:
        add_resize_route(app, engine, api_key)
    return TestClient(app), llm_engine


def metrics(client: TestClient) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples}


def streamed_text(client: TestClient, body: dict, between=None) -> str:
    """The text of a streamed completion; `between()` runs after its 3rd event (the request running)."""
    text, n = "", 0
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            text += json.loads(line[6:])["choices"][0]["text"]
            n += 1
            if n == 3 and between is not None:
                between()
    return text


def test_live_resize_keeps_a_running_stream_identical(device, attention_backend):
    client, llm_engine = serve(device, attention_backend)
    body = {"model": MODEL, "prompt": "Resize me while I run", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    with client:
        alone = streamed_text(client, body)
        floor = int(metrics(client)["wisp_kv_admission_floor_blocks"])
        answers = []

        def resize():
            for cap, blocks in ((4, floor), (16, 2 * floor), (6, floor + 3)):
                r = client.post("/admin/resize", json={"expert_cap": cap, "kv_blocks": blocks})
                assert r.status_code == 200, r.text
                answers.append(r.json())

        assert streamed_text(client, body, between=resize) == alone
        assert [(a["expert_cap"], a["kv_blocks"]) for a in answers] == [(4, floor), (16, 2 * floor), (6, floor + 3)]
        m = metrics(client)
        assert m["wisp_expert_cap"] == 6 and m["wisp_kv_blocks_capacity"] == floor + 3 and m["wisp_kv_blocks_used"] == 0
        r = client.post("/admin/resize", json={"kv_blocks": 2 * floor})  # KV alone
        assert r.status_code == 200 and r.json()["expert_cap"] == 6 and r.json()["kv_blocks"] == 2 * floor
        assert llm_engine.pool.num_blocks == 2 * floor


@pytest.mark.parametrize("body, says", [({"kv_blocks": 1}, "KV pool too small"), ({"expert_cap": 2}, "expert"),
                                        ({"expert_cap": 999}, "expert"), ({"expert_cap": "x"}, "expert_cap"),
                                        ({"experts": 4}, "experts")])
def test_refused_sizes_are_400_and_change_nothing(device, attention_backend, body, says):
    client, llm_engine = serve(device, attention_backend)
    with client:
        before = (llm_engine.expert_cap, llm_engine.pool.num_blocks)
        r = client.post("/admin/resize", json=body)
        assert r.status_code == 400 and says.lower() in r.json()["error"]["message"].lower(), r.text
        assert (llm_engine.expert_cap, llm_engine.pool.num_blocks) == before
        assert client.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2}).status_code == 200


def test_expert_cap_outside_paged_mode_is_400(device, attention_backend):
    client, _ = serve(device, attention_backend, mode="resident")
    with client:
        r = client.post("/admin/resize", json={"expert_cap": 8})
        assert r.status_code == 400 and "paged" in r.json()["error"]["message"]


def test_not_mounted_hidden_and_keyed(device, attention_backend):
    client, _ = serve(device, attention_backend, mount=False)
    with client:
        assert client.post("/admin/resize", json={"kv_blocks": 64}).status_code == 404
    client, _ = serve(device, attention_backend, api_key="sk-x")
    with client:
        assert "/admin/resize" not in client.get("/openapi.json").json()["paths"]
        assert client.post("/admin/resize", json={"kv_blocks": 64}).status_code == 401
        ok = client.post("/admin/resize", json={"kv_blocks": 64}, headers={"Authorization": "Bearer sk-x"})
        assert ok.status_code == 200, ok.text
