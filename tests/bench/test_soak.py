"""`wisp bench soak`, short (the CI version of the 10-minute soak in RELIABILITY.md).

`wisp serve --model demo` on a free loopback port, 8 client threads for about 26 s: completions and chat,
streamed and not, a third of the clients hanging up mid-stream, bad requests mixed in (each must be a 4xx),
live resizes of both pools every 3 s, a greedy probe before, during and after. Asserted from the JSON report:
no 5xx and no unexpected outcome, no KV block or request left once idle, identical probe outputs, resizes
applied, and a clean SIGTERM exit. RSS is recorded but not asserted here (a short run is mostly warm-up; the
10-minute run checks it), so the command may exit 1 for it alone.
"""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run_wisp

pytestmark = pytest.mark.slow  # a live `wisp serve` subprocess for about 30 s
for needed in ("fastapi", "openai", "httpx"):  # the server's and the clients' (the GPU image has none of them)
    pytest.importorskip(needed)


def test_short_soak(tmp_path):
    out = tmp_path / "soak.json"
    proc = run_wisp(["soak", "--seconds", "26", "--resize-every", "3", "--probe-every", "4", "--out", out],
                    tmp_path / "cache", timeout=900, command="bench")
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(out.read_text())
    failed = {check for check, ok in report["passed"].items() if not ok}
    assert proc.returncode == (1 if failed else 0), proc.stdout
    assert failed <= {"rss_flat"}, proc.stdout
    assert report["five_xx"] == 0, report["server_errors"]
    assert report["passed"]["no_unexpected_outcome"], report["unexpected"]
    assert report["passed"]["no_leak"], report["idle_metrics"]
    assert report["probes_identical"] and len(report["probes"]) >= 4, report["probes"]
    assert report["resizes"]["applied"] >= 4, report["resizes"]["log"]
    by = report["by_outcome"]
    assert by.get("ok", 0) > 0 and by.get("disconnected", 0) > 0 and by.get("4xx", 0) > 0, by
    assert report["exit_code"] == 0 and report["health_after"] == 200
    assert (tmp_path / "soak.server.log").is_file() and "soak: wrote" in proc.stdout


def test_bad_resize_caps_are_one_line(tmp_path):
    proc = run_wisp(["soak", "--resize-caps", "4,x"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "comma-separated integers" in proc.stderr and "Traceback" not in proc.stderr
