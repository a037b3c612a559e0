"""`wisp bench profile`: `steps` end to end on the demo model (CPU: the CPU's operators, or the host's Python),
and `timeline` reading a rank-share step's layers from a hand-made Chrome trace (and one line for a trace without
them)."""

from __future__ import annotations

import json

from tests.cli_runner import run_wisp

STEPS = ["profile", "steps", "--model", "demo", "--device", "cpu", "--mode", "paged", "--cap", "4", "--prompt-len", "16",
         "--warm", "2", "--steps", "2", "--rows", "5"]


def test_steps_profiles_the_demo_and_its_trace_has_no_rank_share_step(tmp_path):
    trace = tmp_path / "trace.json"
    proc = run_wisp([*STEPS, "--trace", trace], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    assert "demo paged decode: 2 step(s)" in proc.stdout and "Self CPU time total" in proc.stdout
    assert json.loads(trace.read_text())["traceEvents"]
    proc = run_wisp(["profile", "timeline", trace], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "no rank-share layer-steps" in proc.stderr and "Traceback" not in proc.stderr


def test_steps_on_the_host_lists_python_functions(tmp_path):
    proc = run_wisp([*STEPS, "--host"], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    assert "ms a step unprofiled" in proc.stdout and "Ordered by: cumulative time" in proc.stdout


def test_steps_profile_a_batch_decoding_together_through_the_wide_step(tmp_path):
    """--batch 4 at cap 4 of the demo's top-4: the four requests decode together (load control off), so the profiled
    steps are wide and run expert-major."""
    args = [a if a != "5" else "80" for a in STEPS]  # --rows 80: deep enough for the expert-major function
    proc = run_wisp([*args, "--batch", "4", "--host"], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    assert "compute_from_copies" in proc.stdout
    proc = run_wisp([*args, "--host"], tmp_path / "cache", command="bench")  # one request fits the slots
    assert proc.returncode == 0 and "compute_from_copies" not in proc.stdout


def _host(name: str, ts: float, dur: float, correlation: int | None = None) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {"correlation": correlation}}


def _device(cat: str, name: str, ts: float, dur: float, correlation: int) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": correlation}}


def test_timeline_divides_each_layer_step_into_cpu_and_serial_parts(tmp_path):
    events = [_host("cudaEventSynchronize", 0, 10), _host("cudaGraphLaunch", 200, 5, 1),  # CPU 190 us, then piece 1
              _device("kernel", "merge", 210, 40, 1), _device("gpu_memcpy", "Memcpy DtoH", 260, 10, 1),
              _host("cudaEventSynchronize", 300, 20), _host("cudaGraphLaunch", 500, 5, 2),  # CPU 180 us, piece 2
              _device("kernel", "merge", 510, 30, 2), _device("gpu_memcpy", "Memcpy DtoH", 550, 10, 2),
              _host("cudaEventSynchronize", 600, 20), _host("cudaGraphLaunch", 800, 5, 3)]
    trace = tmp_path / "split.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    proc = run_wisp(["profile", "timeline", trace], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "2 layer-steps inside steps, 0 step boundaries; means in us"
    assert lines[1] == "inside: cpu 185.0, serial 120.0, to_gpu 10.0, gpu_busy 45.0, gpu_idle 10.0, wake 55.0"
    assert "35.00  merge" in proc.stdout and "10.00  Memcpy DtoH" in proc.stdout


def test_a_file_that_is_no_chrome_trace_is_one_line(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    proc = run_wisp(["profile", "timeline", tmp_path / "x.json"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "not a Chrome trace" in proc.stderr and "Traceback" not in proc.stderr


def test_sampling_times_each_preset_at_each_batch_and_refuses_an_unknown_one(tmp_path):
    out = tmp_path / "sampling.json"
    proc = run_wisp(["profile", "sampling", "--vocab", "1000", "--batch", "1,3", "--repeats", "2", "--device", "cpu",
                     "--out", out], tmp_path, timeout=120, command="bench")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())
    assert set(rec["steps"]) == {f"{p}/batch_{b}" for p in ("greedy", "temperature", "top-p", "qwen3") for b in (1, 3)}
    assert all(s["ms_a_step"] > 0 for s in rec["steps"].values()) and "qwen3        batch   3" in proc.stdout
    proc = run_wisp(["profile", "sampling", "--params", "beam"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "unknown sampling preset 'beam'" in proc.stderr and "Traceback" not in proc.stderr
