"""The HTTP API over a FakeEngine: responses, SSE format, every bad input, auth, metrics."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.helpers import MODEL, make_client
from tests.server.fake_engine import ByteTokenizer, scripted_text
from wisp.models.demo import DEMO_CHAT_TEMPLATE
from wisp.server.chat_template import ChatTemplate


def sse_payloads(body: str) -> list[dict]:
    """The JSON payloads of an SSE body, checking its framing and the closing [DONE]."""
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def chat_prompt(messages: list[dict]) -> list[int]:
    return ByteTokenizer().encode(ChatTemplate(DEMO_CHAT_TEMPLATE).render(messages))


def assert_error(resp, status: int, *needles: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    for needle in needles:
        assert needle in body["error"]["message"], body
    return body["error"]


# -- happy paths ------------------------------------------------------------------------------------
def test_health_and_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    data = client.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == [MODEL]
    assert data["data"][0]["max_model_len"] == 128


def test_completion(client):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 5, "temperature": 0})
    body = resp.json()
    assert resp.status_code == 200, body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    (choice,) = body["choices"]
    assert choice["text"] == scripted_text(list(b"Hello"), 5)
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


@pytest.mark.parametrize("prompt", [[72, 105], [[72, 105]], ["Hi"]])
def test_completion_prompt_forms(client, prompt):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 3}).json()
    assert body["choices"][0]["text"] == scripted_text([72, 105], 3), body


def test_default_max_tokens_is_16_and_fits_the_context(client):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 10}).json()
    assert body["usage"]["completion_tokens"] == 16
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 124}).json()
    assert body["usage"]["completion_tokens"] == 4  # capped at max_model_len (128) - prompt


def test_chat_completion(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4})
    body = resp.json()
    assert resp.status_code == 200, body
    prompt = chat_prompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi"}])
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": scripted_text(prompt, 4)}
    assert body["usage"]["prompt_tokens"] == len(prompt) and body["usage"]["completion_tokens"] == 4


def test_chat_without_max_tokens_fills_the_context(client):
    messages = [{"role": "user", "content": "Hi"}]
    body = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}).json()
    assert body["usage"]["total_tokens"] == 128


def test_eos_finishes_with_stop(client):
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "a<eos>", "max_tokens": 10}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 3 and len(body["choices"][0]["text"]) == 2


def test_stop_strings(client):
    full = scripted_text(list(b"Hello"), 20)
    stop = full[6:9]
    body = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 20, "stop": [stop]}).json()
    assert body["choices"][0] == {"index": 0, "text": full[:6], "logprobs": None, "finish_reason": "stop"}
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 20, "stop": stop,
                                                "stream": True})
    chunks = sse_payloads(resp.text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full[:6]  # nothing past the stop was streamed


# -- streaming --------------------------------------------------------------------------------------
def test_completion_stream(client):
    req = {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "stream": True}
    resp = client.post("/v1/completions", json=req)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    chunks = sse_payloads(resp.text)
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == scripted_text(list(b"Hello"), 6)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]


def test_stream_usage_chunk(client):
    req = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_payloads(client.post("/v1/completions", json=req).text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3,
                                                                   "total_tokens": 8}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_chat_stream(client):
    messages = [{"role": "user", "content": "Hi"}]
    req = {"model": MODEL, "messages": messages, "max_tokens": 5, "stream": True}
    chunks = sse_payloads(client.post("/v1/chat/completions", json=req).text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == scripted_text(chat_prompt(messages), 5)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_holds_back_incomplete_utf8():
    from tests.server.fake_engine import StepOutput
    from wisp.server.streaming import TextDeltas

    deltas = TextDeltas(())
    seen = [deltas.next(StepOutput("r", [], [], text, done, None, 1)) for text, done in
            [("a", False), ("a\ufffd", False), ("aé", False), ("aéb", True)]]
    assert seen == ["a", "", "é", "b"]


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [b"{not json", b'{"model": "fake", "prompt": "x",}', b"", b"[1, 2]", b'"text"'])
def test_malformed_json_is_400(client, body):
    resp = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 400)


def test_non_json_content_type_says_so(client):
    body = b'{"model": "fake", "prompt": "x"}'
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):  # curl -d without -H sends the first
        resp = client.post("/v1/completions", content=body, headers={"content-type": content_type})
        assert_error(resp, 400, "Content-Type: application/json", content_type)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": None, "stream": "yes"}, "stream"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"model": 3}, "model"),
        ({"stop": 7}, "stop"),
        ({"seed": "1"}, "seed"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ],
)
def test_wrong_types_are_400(client, fields, param):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", **fields})
    assert assert_error(resp, 400)["param"] == param


@pytest.mark.parametrize(
    "messages",
    [[], "hi", [{"content": "no role"}], [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image"}]}]],
)
def test_bad_messages_are_400(client, messages):
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert assert_error(resp, 400)["param"] == "messages"


def test_missing_fields_are_400(client):
    assert_error(client.post("/v1/completions", json={"prompt": "x"}), 400, "model")
    assert_error(client.post("/v1/completions", json={"model": MODEL}), 400, "prompt")


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("n", [0, 129])
def test_n_out_of_range_is_400(client, route, n):
    body = {"model": MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}], "n": n}
    err = assert_error(client.post(route, json=body), 400, "n must be in [1, 128]")
    assert err["param"] == "n"


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_each_get_an_index(client, stream):
    body = {"model": MODEL, "prompt": "x", "n": 3, "max_tokens": 4, "stream": stream}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    if stream:
        chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
        finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
        assert sorted(finished) == [0, 1, 2]
    else:
        assert [c["index"] for c in resp.json()["choices"]] == [0, 1, 2]
        assert resp.json()["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {"a": 2.0}}, "token ids"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ({"prompt": ["a", "b"]}, "one prompt"),
        ({"prompt": ""}, "empty"),
        ({"prompt": []}, "empty"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"prompt": [1, 2, 999]}, "vocabulary"),
        ({"prompt": [1, -2]}, "vocabulary"),
    ],
)
def test_unsupported_or_out_of_range_is_400(client, fields, needle):
    assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", **fields}), 400, needle)


def test_unknown_model_is_404(client):
    err = assert_error(client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, "gpt-9")
    assert err["code"] == "model_not_found" and err["param"] == "model"
    msgs = [{"role": "user", "content": "x"}]
    assert_error(client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": msgs}), 404, "gpt-9")


def test_unknown_route_and_method_are_openai_errors(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/completions"), 405)


def test_too_long_is_400_with_the_numbers(client):
    err = assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 120, "max_tokens": 20}), 400,
                       "maximum context length is 128", "140 tokens", "120 in the prompt", "20 for the completion")
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    err = assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 128}), 400, "128 in the prompt")
    assert err["param"] == "prompt"
    msgs = [{"role": "user", "content": "y" * 200}]
    assert_error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs}), 400, "in the prompt")


def test_no_request_leaks_after_errors(served):
    client, _, engine = served
    client.post("/v1/completions", json={"model": MODEL, "prompt": [1, 999]})
    client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == stats["num_waiting"] == 0


# -- auth -------------------------------------------------------------------------------------------
def test_api_key():
    client, _, _ = make_client(api_key="sekret")
    with client:
        req = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        err = assert_error(client.post("/v1/completions", json=req), 401)
        assert err["code"] == "invalid_api_key"
        assert_error(client.post("/v1/completions", json=req, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(client.post("/v1/completions", json=req, headers={"Authorization": "sekret"}), 401)
        assert_error(client.get("/v1/models"), 401)
        assert_error(client.post("/v1/completions", content=b"{bad", headers={"Authorization": "Basic sekret"}), 401)
        ok = client.post("/v1/completions", json=req, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200, ok.text
        assert client.get("/v1/models", headers={"Authorization": "bearer sekret"}).status_code == 200
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200


# -- concurrency, metrics, engine faults -------------------------------------------------------------
def test_more_requests_than_the_running_limit_are_queued(served):
    client, fake, _ = served
    fake.step_delay = 0.002
    prompts = [f"prompt {i}" for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        bodies = list(pool.map(lambda p: client.post("/v1/completions", json={"model": MODEL, "prompt": p,
                                                                              "max_tokens": 8}).json(), prompts))
    for p, body in zip(prompts, bodies):
        assert body["choices"][0]["text"] == scripted_text(list(p.encode()), 8), body
    assert fake.peak <= fake.total and len(fake.running) == 0


def metric_values(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
                                 if sample.labels else "")
            out[key] = sample.value
    return out


def test_metrics_parse(served):
    client, fake, _ = served
    for _ in range(2):
        client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 5})
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    m = metric_values(resp.text)
    for name in ("wisp_expert_hits_total", "wisp_expert_misses_total", "wisp_expert_evictions_total",
                 "wisp_expert_loads_total", "wisp_expert_cpu_computed_total", "wisp_expert_bytes_h2d_total", "wisp_prefix_cache_hit_tokens_total",
                 "wisp_prefix_cache_miss_tokens_total", "wisp_preemptions_total", "wisp_kv_blocks_used_peak",
                 "wisp_expert_hit_rate"):
        assert name in m, name
    assert m["wisp_expert_hits_total"] == 10 * fake.steps
    assert m["wisp_kv_blocks_used"] == 0 and m["wisp_kv_blocks_capacity"] == fake.total
    assert m["wisp_kv_blocks_free"] + m["wisp_kv_blocks_cached"] == fake.total
    assert m["wisp_requests_running"] == 0 and m["wisp_requests_waiting"] == 0
    assert m["wisp_time_to_first_token_seconds_count"] == 2
    assert m["wisp_inter_token_latency_seconds_count"] == 2 * 4
    assert m["wisp_requests_finished_total{finish_reason=length}"] == 2
    assert m["wisp_generation_tokens_total"] == 10 and m["wisp_prompt_tokens_total"] == 10


def test_engine_step_failure_is_503_then_recovers(served):
    client, fake, _ = served
    fake.fail_steps = 1
    err = assert_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3}), 503,
                       "injected step failure")
    assert err["type"] == "server_error"
    ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    assert ok.status_code == 200, ok.text
    assert client.get("/health").status_code == 200


# -- one request's failure stays its own ---------------------------------------------------------------
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("value", [1e-50, 7e-46])  # both round to 0 in float32
def test_sampling_values_float32_cannot_hold_are_400_naming_the_param(client, route, field, value):
    body = {"model": MODEL, "prompt": "Hello", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            field: value}
    err = assert_error(client.post(route, json=body), 400, field, "float32")
    assert err["param"] == field and err["type"] == "invalid_request_error"


def test_a_request_failing_alone_is_500_for_it_only(served):
    client, fake, engine = served
    fake.step_delay = 0.002
    normal = {"model": MODEL, "max_tokens": 8}
    with ThreadPoolExecutor(4) as pool:
        poisoned = pool.submit(client.post, "/v1/completions", json={**normal, "prompt": "x<fail>"})
        streamed = pool.submit(client.post, "/v1/completions", json={**normal, "prompt": "y<fail>", "stream": True})
        others = [pool.submit(client.post, "/v1/completions", json={**normal, "prompt": p}) for p in ("a", "bb")]
    err = assert_error(poisoned.result(), 500, "failed in its sampling")
    assert err["type"] == "server_error" and err["code"] == "request_failed"
    events = sse_payloads(streamed.result().text)  # the error event, then [DONE]
    assert events[-1]["error"]["code"] == "request_failed" and "error" not in events[0]
    for prompt, resp in zip(("a", "bb"), others):
        body = resp.result().json()
        assert body["choices"][0]["text"] == scripted_text(list(prompt.encode()), 8), body
        assert body["choices"][0]["finish_reason"] == "length"
    assert fake.used == 0 and not fake.running
    assert client.get("/health").status_code == 200
    m = metric_values(client.get("/metrics").text)
    assert m["wisp_requests_finished_total{finish_reason=error}"] == 2
