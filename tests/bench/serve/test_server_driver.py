"""wisp.bench.serve.server_driver against a scripted OpenAI-compatible server (httpx's MockTransport): what each
request sends, which chunks are timed, the usage's token count, the /metrics counters' growth; and once, slow,
against a live `wisp serve`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from tests.cli_runner import run_wisp
from wisp.bench.serve.load import ClosedLoop, OpenLoop
from wisp.bench.serve.server_driver import client_for, drive_server, metrics_fields, scrape, served_model

httpx = pytest.importorskip("httpx")

METRICS_TEXT = """# TYPE wisp_expert_hits counter
wisp_expert_hits_total {hits}
# TYPE wisp_expert_misses counter
wisp_expert_misses_total 10.0
# TYPE wisp_expert_bytes_h2d counter
wisp_expert_bytes_h2d_total 4096.0
# TYPE wisp_preemptions counter
wisp_preemptions_total 0.0
"""


class ScriptedServer:
    """Streams, for each completion, the chunks "a", "" (text held back), "b", a last empty one with the
    finish reason, then the usage; keeps each completion's body; its hit counter grows by 5 a scrape."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.hits = 30

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "served-name", "object": "model"}]})
        if request.url.path == "/metrics":
            self.hits += 5
            return httpx.Response(200, text=METRICS_TEXT.format(hits=float(self.hits)))
        body = json.loads(request.content)
        self.bodies.append(body)
        texts = [("a", None), ("", None), ("b", None), ("", "length")]
        events = [{"choices": [{"index": 0, "text": t, "finish_reason": f}]} for t, f in texts]
        events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"],
                                                "total_tokens": 3 + body["max_tokens"]}})
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


async def _run(server: ScriptedServer, load, prompts):
    async with client_for("http://scripted", None, transport=httpx.MockTransport(server)) as client:
        model = await served_model(client)
        before = await scrape(client)
        times, wall = await drive_server(client, model, load, prompts, output_len=5, temperature=0.0)
        return model, times, wall, metrics_fields(before, await scrape(client))


@pytest.mark.parametrize("load", [ClosedLoop(2, 3), OpenLoop(200.0, 3, seed=1)])
def test_each_request_is_streamed_and_its_text_chunks_timed(load):
    server = ScriptedServer()
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    model, times, wall, metrics = asyncio.run(_run(server, load, prompts))
    assert model == "served-name"
    assert sorted(b["prompt"] for b in server.bodies) == prompts
    assert all(b["model"] == "served-name" and b["stream"] and b["ignore_eos"] and b["max_tokens"] == 5
               and b["stream_options"] == {"include_usage": True} for b in server.bodies)
    for r in times:
        assert len(r.token_times) == 2 and r.output_tokens == 5  # the chunks with text; the usage's count
        assert r.start <= r.token_times[0] <= r.token_times[1]
    assert wall >= max(r.e2e for r in times) - 1e-9
    assert metrics == {"expert_hits": 5, "expert_misses": 0, "bytes_h2d": 0, "preemptions": 0, "hit_rate": 1.0,
                       "bytes_h2d_per_token": None, "load_control_state": None}


def test_a_stream_with_no_text_is_timed_at_its_last_chunk():
    class Silent(ScriptedServer):
        def __call__(self, request):
            resp = super().__call__(request)
            if request.url.path == "/v1/completions":
                resp = httpx.Response(200, text=re.sub(r'"text": "[ab]"', '"text": ""', resp.text))
            return resp

    _, times, _, _ = asyncio.run(_run(Silent(), ClosedLoop(1, 1), [[1]]))
    assert len(times[0].token_times) == 1 and times[0].output_tokens == 5 and times[0].gaps == []


@pytest.mark.slow
def test_against_a_live_wisp_serve(tmp_path):
    """`wisp bench serve --server` against `wisp serve --model demo` (a subprocess on a free port)."""
    server = subprocess.Popen([sys.executable, "-m", "wisp", "serve", "--model", "demo", "--device", "cpu",
                               "--port", "0", "--max-concurrency", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "wisp: serving" not in line:  # what it says before (its sampling defaults), then the ready line
            line = server.stdout.readline()
            assert line, "the server exited before it was ready"
        url = re.search(r"on (http://\S+)", line).group(1)
        out = tmp_path / "served.json"
        proc = run_wisp(["serve", "--model", "demo", "--server", url, "--concurrency", "2", "--num-requests", 3,
                         "--prompt-len", 8, "--output-len", 6, "--out", out], tmp_path / "cache", command="bench")
        assert proc.returncode == 0, proc.stderr
        (record,) = json.loads(out.read_text())
        assert record["target"] == url and record["output_tokens"] == 3 * 6 and record["decode_width"] is None
        assert record["expert_hits"] + record["expert_misses"] > 0 and record["preemptions"] == 0
        assert 0 < record["ttft_p50_s"] <= record["e2e_p50_s"]
    finally:
        server.terminate()
        server.wait(timeout=60)
