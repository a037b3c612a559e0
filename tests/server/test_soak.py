"""A short run of benchmarks/soak.py (the CI version of the 10-minute soak in RELIABILITY.md).

`wisp serve --model demo` on a free loopback port, 8 client threads for about 55 s: completions and chat,
streamed and not, a third of the clients hanging up mid-stream, bad requests mixed in (each must be a 4xx),
live resizes of both pools every 3 s, a greedy probe before, during and after. Asserted: no 5xx and no
unexpected outcome, no KV block or request left once idle, identical probe outputs, resizes applied, and a
clean SIGTERM exit. RSS is recorded but not asserted here (a minute is mostly warm-up; the 10-minute run checks it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a live `wisp serve` subprocess for about 30 s

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("wisp_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def test_short_soak(tmp_path):
    soak = load_soak()
    cfg = soak.SoakConfig(seconds=26, resize_every=3, probe_every=4, log=str(tmp_path / "server.log"))
    report = soak.run_soak(cfg, echo=lambda *_: None)
    print(soak.summary(report))
    assert report["five_xx"] == 0, report["server_errors"]
    assert report["passed"]["no_unexpected_outcome"], report["unexpected"]
    assert report["passed"]["no_leak"], report["idle_metrics"]
    assert report["probes_identical"] and len(report["probes"]) >= 4, report["probes"]
    assert report["resizes"]["applied"] >= 4, report["resizes"]["log"]
    by = report["by_outcome"]
    assert by.get("ok", 0) > 0 and by.get("disconnected", 0) > 0 and by.get("4xx", 0) > 0, by
    assert report["exit_code"] == 0 and report["health_after"] == 200
