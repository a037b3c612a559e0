"""`wisp bench llama-cpp run` against a stand-in llama-bench: placements become flags, llama-bench's JSON
becomes our records (decode tok/s, TTFT per prompt length = tokens / pp rate), and a failure is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import run_wisp
from wisp.bench.llama_cpp.llama_bench import placement_flags
from wisp.errors import WispError

FAKE_BENCH = '''#!{python}
import json, sys
args = sys.argv[1:]
open({log!r}, "a").write(" ".join(args) + "\\n")
if "-ncmoe" in args and args[args.index("-ncmoe") + 1] == "{fail_at}":
    sys.exit("llama_bench: error: failed to load model")
common = {{"model_type": "olmoe A1.7B BF16", "model_size": 13838589952, "gpu_info": "NVIDIA H200", "n_threads": 16}}
tests = [dict(common, n_prompt=int(p), n_gen=0, avg_ts=1000.0 + int(p)) for p in args[args.index("-p") + 1].split(",")]
tests.append(dict(common, n_prompt=0, n_gen=int(args[args.index("-n") + 1]), avg_ts=40.0))
print(json.dumps(tests))
'''


def _fake(tmp_path: Path, fail_at: str = "none") -> tuple[Path, Path]:
    bench, log = tmp_path / "llama-bench", tmp_path / "calls.txt"
    bench.write_text(FAKE_BENCH.format(python=sys.executable, log=str(log), fail_at=fail_at))
    bench.chmod(0o755)
    return bench, log


def _run(tmp_path: Path, bench: Path, placements: str, *more: str) -> subprocess.CompletedProcess:
    return run_wisp(["llama-cpp", "run", "--llama-bench", bench, "--gguf", "m.gguf", "--model", "olmoe-1b-7b",
                     "--placements", placements, "--prompts", "512,2048", "--decode-tokens", "8", "--extra", "-t 4",
                     "--commit", "abc", "--out", tmp_path / "peer.json", *more], tmp_path / "cache", timeout=120,
                    command="bench")


def test_each_placement_is_one_llama_bench_run_and_one_record(tmp_path):
    bench, log = _fake(tmp_path)
    proc = _run(tmp_path, bench, "all-cpu,half,all-gpu")
    assert proc.returncode == 0, proc.stderr
    records = json.loads((tmp_path / "peer.json").read_text())
    assert [r["placement_flags"] for r in records] == ["-ngl 99 -ncmoe 16", "-ngl 99 -ncmoe 8", "-ngl 99 -ncmoe 0"]
    first = records[0]
    assert first["peer"] == "llama.cpp" and first["llama_cpp_commit"] == "abc" and first["decode_tok_s"] == 40.0
    assert first["ttft_s"] == {"512": round(512 / 1512, 4), "2048": round(2048 / 3048, 4)}
    assert first["command"].endswith("-o json -ngl 99 -ncmoe 16 -t 4") and first["layers"] == 16
    assert len(log.read_text().splitlines()) == 3


def test_the_unsampled_decode_is_a_second_decode_only_run(tmp_path):
    bench, log = _fake(tmp_path)
    proc = _run(tmp_path, bench, "all-cpu", "--unsampled-decode")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "peer.json").read_text())[0]
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "-p 0 -n 8" in calls[1] and calls[1].endswith("-ncmoe 16 -t 4")
    assert record["decode_tok_s_unsampled"] == 40.0 and record["command_unsampled"].split()[1:] == calls[1].split()
    assert record["ttft_s"] == {"512": round(512 / 1512, 4), "2048": round(2048 / 3048, 4)}  # from the sampled run


def test_a_failed_llama_bench_is_one_clear_line(tmp_path):
    bench, _ = _fake(tmp_path, fail_at="8")
    proc = _run(tmp_path, bench, "all-cpu,half")
    assert proc.returncode == 2 and "llama-bench failed" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_placements_name_the_layers_whose_experts_stay_on_the_cpu():
    assert placement_flags("half", 48) == ["-ngl", "99", "-ncmoe", "24"]
    with pytest.raises(WispError, match="unknown placement 'most'; choose from all-cpu, half, all-gpu"):
        placement_flags("most", 48)


def test_an_unknown_placement_stops_before_llama_bench_runs(tmp_path):
    bench, log = _fake(tmp_path)
    proc = _run(tmp_path, bench, "all-cpu,most")
    assert proc.returncode == 2 and "unknown placement 'most'" in proc.stderr and "Traceback" not in proc.stderr
    assert not log.exists()
