"""`wisp bench serve` end to end on the demo model (CPU): closed loops at W = 1, 2 and an open loop in one
invocation, each record's fields consistent with each other; the plot; bad input is one line and exit 2."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.cli_runner import run_wisp
from tests.test_bad_input import assert_one_line_error
from wisp.cli import main

REQUESTS, OUTPUT_LEN = 3, 4
KEYS = {"loop", "concurrency", "request_rate", "load_control", "requests", "output_tokens", "wall_s", "decode_tok_s",
        "ttft_p50_s", "itl_p99_s", "itl_count", "e2e_p90_s", "steps", "decode_steps", "decode_tokens", "decode_width",
        "expert_hits", "expert_misses", "hit_rate", "bytes_h2d", "preemptions", "load_control_state", "commit",
        "command", "gpu", "h2d_gbps_probe", "mode", "expert_cap", "routing", "target"}


def _ordered(r: dict, name: str) -> bool:
    return r[f"{name}_p50_s"] <= r[f"{name}_p90_s"] <= r[f"{name}_p99_s"]


def test_closed_and_open_loop_records_add_up(tmp_path):
    out = tmp_path / "serve.json"
    proc = run_wisp(["serve", "--model", "demo", "--load-format", "dummy", "--device", "cpu", "--concurrency", "1,2",
                     "--request-rate", "50", "--num-requests", REQUESTS, "--prompt-len", 16, "--output-len", OUTPUT_LEN,
                     "--expert-cap", 8, "--max-concurrency", 2, "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [(r["loop"], r["concurrency"], r["request_rate"]) for r in records] == [
        ("closed", 1, None), ("closed", 2, None), ("open", None, 50.0)]
    for r in records:
        assert KEYS <= set(r) and r["load_control"] == "on" and r["target"] == "engine" and r["expert_cap"] == 8
        assert r["max_concurrency"] == 2
        assert r["requests"] == REQUESTS and r["output_tokens"] == REQUESTS * OUTPUT_LEN
        assert r["itl_count"] == REQUESTS * (OUTPUT_LEN - 1) == r["decode_tokens"]  # no preemption: every later token decodes
        assert r["preemptions"] == 0
        widths = {int(w): n for w, n in r["decode_width"].items()}
        assert sum(widths.values()) == r["decode_steps"] <= r["steps"]
        assert sum(w * n for w, n in widths.items()) == r["decode_tokens"]
        assert max(widths) <= (r["concurrency"] or 2)  # the engine runs 2 at most
        assert _ordered(r, "ttft") and _ordered(r, "itl") and _ordered(r, "e2e")
        assert 0 < r["ttft_p50_s"] <= r["e2e_p50_s"] and r["e2e_p99_s"] <= r["wall_s"] + 1e-6
        assert r["decode_tok_s"] == pytest.approx(r["output_tokens"] / r["wall_s"], rel=1e-3)
        assert r["expert_hits"] + r["expert_misses"] > 0 and r["bytes_h2d"] > 0  # paged, 8 of 16 experts a layer
        assert r["command"].startswith("wisp bench serve --model demo") and r["gpu"] == "cpu"
    assert set(records[0]["decode_width"]) == {"1"}  # W = 1: one request decodes at a time
    assert "load control" in proc.stdout.splitlines()[-1]  # the table's legend


def test_the_plot_draws_each_load_control_setting(tmp_path):
    pytest.importorskip("matplotlib")
    from wisp.bench.serve.plot import plot_runs

    base = {"loop": "closed", "request_rate": None, "model": "demo", "mode": "paged", "prompt_len": 16, "output_len": 4}
    records = [{**base, "concurrency": w, "load_control": lc, "decode_tok_s": 10.0 * w, "itl_p99_s": 0.01 * w}
               for lc in ("on", "off") for w in (1, 2, 4)]
    plot_runs(records, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flags, fragment", [
    (["--concurrency", "0"], "positive integer"),
    (["--concurrency", "1,x"], "positive integer"),
    (["--request-rate", "0"], "positive number"),
    (["--request-rate", "-2"], "positive number"),
    (["--mode", "sideways"], "invalid choice"),
    (["--load-control", "on,maybe"], "unknown load control 'maybe'; choose one of: on, off, width:N"),
    (["--load-control", "width:0"], "unknown load control 'width:0'"),
    (["--server", "http://127.0.0.1:1", "--load-control", "off"], "the server's own"),
])
def test_bad_input_is_one_line_and_exit_2(flags, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "serve", "--model", "demo", *flags])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert_one_line_error(SimpleNamespace(returncode=2, stdout=captured.out, stderr=captured.err), fragment)
