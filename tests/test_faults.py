"""Faults at load and while recording (issue 13 item 5; the table in RELIABILITY.md, "Faults").

- pinning the expert host memory fails: paged/offload fall back to pageable memory with one warning and
  generate the same tokens; zero-copy stops with one WispError naming the bytes;
- a checkpoint missing a shard, truncated (anywhere), or quantized (config or tensors): one WispError;
- a device out-of-memory at load: one WispError with the bytes needed and a budget that fits;
- a full disk while writing a `--record-routing` trace: the trace is lost whole (no partial file), one
  warning, and the command's output and exit status stand.

Faults are injected by monkeypatching the allocation / write to raise what torch / the OS raise.
The checkpoints are small random Qwen3-MoE ones (`write_random_checkpoint`: one shard per layer + index).
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from wisp import LLM, SamplingParams, WispError
from wisp.config import EngineConfig
from wisp.engine.load_oom import RESERVE, DeviceBytes, oom_message
from wisp.models.config_parsers import model_config, read_model_config
from wisp.models.demo import DEMO_CONFIG
from wisp.models.random_checkpoint import write_random_checkpoint
from wisp.trace.format import RoutingTrace

SMALL = {**DEMO_CONFIG, "num_hidden_layers": 2, "max_position_embeddings": 256}
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_random_checkpoint(SMALL, tmp_path_factory.mktemp("faults") / "good", seed=3)


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def _shards(path: Path) -> list[str]:
    return sorted(set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values()))


def _one_line_error(info) -> str:
    message = str(info.value)
    assert "\n" not in message and message
    return message


@pytest.fixture(scope="module")
def reference(ckpt) -> list[int]:
    return LLM(str(ckpt), device="cpu", expert_cap=8).generate([PROMPT], GREEDY)[0].token_ids


# -- 1. pinned host memory ------------------------------------------------------------------------


@pytest.fixture
def pinning_fails(monkeypatch):
    """Make the loader want pinned masters (as on CUDA) and every pinned allocation raise as torch does
    (on a machine without CUDA this is torch's own message; on CUDA, cudaHostAlloc's)."""
    import wisp.models.loader as loader

    real = loader._allocate
    calls = {"pinned": 0}

    def allocate(shape, dtype, pin):
        if pin:
            calls["pinned"] += 1
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)\nCUDA kernel errors might be reported later")
        return real(shape, dtype, pin=False)

    monkeypatch.setattr(loader, "_wants_pinned", lambda engine, device: engine.mode != "resident")
    monkeypatch.setattr(loader, "_allocate", allocate)
    return calls


@pytest.mark.parametrize("mode", ["paged", "offload"])
def test_failed_pinning_falls_back_to_pageable_with_one_warning(ckpt, reference, pinning_fails, caplog, mode):
    cfg = read_model_config(ckpt)
    with caplog.at_level(logging.WARNING):
        llm = LLM(str(ckpt), device="cpu", mode=mode, expert_cap=8 if mode == "paged" else None)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    layer_bytes = cfg.num_experts * 2 * cfg.moe_intermediate_size * cfg.hidden_size * 4  # gate_up, float32
    assert "could not pin" in text and str(layer_bytes) in text and "pageable" in text and "\n" not in text
    assert str(2 * cfg.num_experts * cfg.expert_bytes) in text  # all experts' bytes
    assert pinning_fails["pinned"] == 1  # tried once, then pageable for the rest without retrying
    assert llm.engine.config.pin_memory is False  # graphs off: they may capture pinned memory only
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == reference


def test_failed_pinning_stops_zero_copy_with_the_size(ckpt, pinning_fails):
    cfg = read_model_config(ckpt)
    with pytest.raises(WispError) as info:
        LLM(str(ckpt), device="cpu", mode="zero-copy")
    message = _one_line_error(info)
    total = len(cfg.moe_layer_ids) * cfg.num_experts * cfg.expert_bytes
    assert "could not pin" in message and f"{total} bytes" in message and "zero-copy" in message
    assert "cudaHostAlloc" in message and "--mode paged" in message


def test_pinning_raises_the_real_torch_error_off_cuda():
    """Without CUDA, torch itself refuses pin_memory=True with a RuntimeError: the error the fallback catches."""
    from wisp.models.loader import HostMemory

    if torch.cuda.is_available():
        pytest.skip("pinning works here")
    host = HostMemory(pin=True, total_bytes=64)
    t = host.empty((4, 4), torch.float32, "a test tensor")
    assert host.fell_back and not t.is_pinned() and t.shape == (4, 4)


# -- 2. broken checkpoints ------------------------------------------------------------------------


def test_missing_shard(ckpt, tmp_path):
    path = _copy(ckpt, tmp_path / "m")
    gone = _shards(path)[1]
    (path / gone).unlink()
    with pytest.raises(WispError) as info:
        LLM(str(path), device="cpu")
    message = _one_line_error(info)
    assert gone in message and "missing" in message and "index" in message


@pytest.mark.parametrize("cut", ["half", "last_byte", "header"])
def test_truncated_safetensors(ckpt, tmp_path, cut):
    path = _copy(ckpt, tmp_path / "t")
    shard = path / _shards(path)[1]
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate({"half": size // 2, "last_byte": size - 1, "header": 5}[cut])
    with pytest.raises(WispError) as info:
        LLM(str(path), device="cpu")
    message = _one_line_error(info)
    assert shard.name in message and "truncated or unreadable" in message


@pytest.mark.parametrize("method, block", [("fp8", [64, 64]), ("gptq", [128, 128]), ("compressed-tensors", None)])
def test_unsupported_quantization_is_refused_naming_what_is_supported(ckpt, tmp_path, method, block):
    path = _copy(ckpt, tmp_path / "q")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": block}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WispError) as info:
        LLM(str(path), device="cpu")
    message = _one_line_error(info)
    assert "quantized" in message and repr(method) in message and "bfloat16" in message
    assert "supported: fp8 (float8_e4m3fn weights with weight_scale_inv in 128 x 128 blocks)" in message


def test_fp8_tensors_without_a_quantization_config_are_refused(ckpt, tmp_path):
    """FP8 weights (+ scales) whose config says nothing: refused at the first float8 tensor, never cast."""
    path = _copy(ckpt, tmp_path / "f8")
    shard = path / _shards(path)[1]
    tensors = load_file(shard)
    key = next(k for k in sorted(tensors) if k.endswith("experts.0.gate_proj.weight"))
    tensors[key] = tensors[key].to(torch.float8_e4m3fn)
    tensors[key.replace(".weight", ".weight_scale_inv")] = torch.ones(1)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(WispError) as info:
        LLM(str(path), device="cpu")
    message = _one_line_error(info)
    assert key in message and "float8_e4m3fn" in message and "quantized" in message


def test_quantized_checkpoint_is_one_cli_error(ckpt, tmp_path, capsys):
    from wisp.cli import main

    path = _copy(ckpt, tmp_path / "q")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8"}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", str(path), "--device", "cpu", "--prompt-ids", "1,2", "--max-tokens", "2"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("wisp: error: the checkpoint is quantized")


# -- 3. device out-of-memory at load --------------------------------------------------------------

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


@pytest.mark.parametrize("where", ["weights", "kv"])
def test_oom_at_load_names_the_bytes_and_the_flags(ckpt, monkeypatch, where):
    import wisp.engine.engine as engine_mod

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError(OOM)  # what torch.cuda.OutOfMemoryError is

    if where == "weights":
        monkeypatch.setattr(engine_mod, "load_model", oom)
    else:
        monkeypatch.setattr(engine_mod.LLMEngine, "_build_pools", oom)
    config = EngineConfig(model=str(ckpt), device="cpu", expert_cap=8, kv_blocks=96)
    with pytest.raises(WispError) as info:
        engine_mod.LLMEngine(config)
    message = _one_line_error(info)
    monkeypatch.undo()
    cfg = read_model_config(ckpt)
    engine = LLM(str(ckpt), device="cpu", expert_cap=8, kv_blocks=96).engine  # the same configuration, loaded
    stats = engine.stats()
    need = DeviceBytes.of(cfg, config, 96, engine.floor_blocks, engine.block_bytes)
    assert need.experts == stats["expert_device_bytes"] + stats["expert_staging_bytes"]
    assert need.kv == stats["kv_blocks_total"] * stats["kv_block_bytes"]
    weights = sum(t.numel() * t.element_size() for t in _non_expert_tensors(engine.model))
    assert abs(need.weights - weights) <= weights // 100  # the planner's count leaves out q/k norms (tiny)
    stage = "loading the weights" if where == "weights" else "allocating the KV pool"
    assert f"out of device memory while {stage}" in message and "CUDA out of memory" in message
    assert f"about {need.total} bytes" in message and str(need.kv_floor) in message
    assert "--expert-cap" in message and "--kv-bytes" in message and "--max-concurrency" in message


def _non_expert_tensors(model):
    seen = {id(model.embed.table): model.embed.table, id(model.lm_head): model.lm_head, id(model.final_norm): model.final_norm}
    for layer in model.layers:
        for part in (layer, layer.attn, layer.shared, layer.dense):
            for value in (vars(part).values() if part is not None else ()):
                if isinstance(value, torch.Tensor):
                    seen[id(value)] = value
    return list(seen.values())


def test_oom_message_names_a_budget_that_fits():
    cfg = model_config(SMALL)
    config = EngineConfig(model="x", expert_cap=16, max_model_len=256)
    floor_blocks, block_bytes = 4 * 256 // 16, 2 * 2 * 2 * 16 * 32 * 4
    need = DeviceBytes.of(cfg, config, 4 * floor_blocks, floor_blocks, block_bytes)
    slot = 2 * cfg.expert_bytes
    # room for the weights, KV as configured, staging and 6 slots: cap 6
    usable = RESERVE + need.weights + need.kv + 2 * cfg.expert_bytes + 6 * slot + 10
    assert "--expert-cap 6 would fit" in oom_message(cfg, config, need, usable, "loading the weights", OOM)
    # only with KV at its floor does a cap >= top_k fit
    usable = RESERVE + need.weights + need.kv_floor + 2 * cfg.expert_bytes + 5 * slot
    assert f"--expert-cap 5 --kv-bytes {need.kv_floor} (the KV floor) would fit" in oom_message(
        cfg, config, need, usable, "loading the weights", OOM)
    # not even top_k slots with the floor: fewer requests at once
    per_request = need.kv_floor // 4
    usable = RESERVE + need.weights + 2 * cfg.expert_bytes + 4 * slot + 2 * per_request
    assert "--max-concurrency 2 --expert-cap 4 would fit" in oom_message(cfg, config, need, usable, "x", OOM)
    # resident mode is told to page
    resident = EngineConfig(model="x", mode="resident", max_model_len=256)
    need_r = DeviceBytes.of(cfg, resident, floor_blocks, floor_blocks, block_bytes)
    usable = RESERVE + need_r.weights + need_r.kv + 2 * cfg.expert_bytes + 9 * slot
    assert "--expert-cap 9 --mode paged would fit" in oom_message(cfg, resident, need_r, usable, "x", OOM)
    # nothing fits
    assert "larger device" in oom_message(cfg, config, need, RESERVE, "x", OOM)


def test_oom_applying_a_startup_plan_is_one_error(ckpt, monkeypatch):
    """`wisp serve --plan/--vram-budget` resizes the pools right after loading: a device OOM there too."""
    from types import SimpleNamespace

    from wisp.cli import _apply_startup_plan

    engine = LLM(str(ckpt), device="cpu", expert_cap=8).engine

    def oom(caps, blocks):
        raise torch.OutOfMemoryError(OOM)

    monkeypatch.setattr(engine, "apply_plan", oom)
    with pytest.raises(WispError) as info:
        _apply_startup_plan(engine, SimpleNamespace(per_layer_caps=(12, 12), kv_blocks=100))
    message = _one_line_error(info)
    cfg = engine.model_config
    assert "out of device memory applying the plan" in message and "[12, 12]" in message
    assert f"{24 * cfg.expert_bytes} bytes" in message and f"{100 * engine.block_bytes} bytes" in message
    assert "--vram-budget" in message


# -- 4. a full disk while writing a routing trace -------------------------------------------------


def _disk_full_after(monkeypatch, nbytes: int):
    """Writes to files opened for writing fail with ENOSPC once `nbytes` have been written."""
    import builtins

    real_open = builtins.open
    written = {"n": 0}

    class Full:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            if written["n"] + len(data) > nbytes:
                raise OSError(errno.ENOSPC, "No space left on device")
            written["n"] += len(data)
            return self._f.write(data)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

    def full_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Full(f) if any(c in mode for c in "wa") else f

    monkeypatch.setattr("wisp.trace.format.open", full_open, raising=False)
    return written


def _trace() -> RoutingTrace:
    ids = np.arange(60, dtype=np.int16).reshape(10, 2, 3) % 16
    return RoutingTrace(ids, np.ones(ids.shape, np.float32), np.arange(10, dtype=np.int32), [0, 1], 16)


@pytest.mark.parametrize("name", ["t.npz", "t.jsonl"])
def test_a_full_disk_loses_the_trace_whole_and_keeps_an_old_one(tmp_path, monkeypatch, name):
    path = tmp_path / name
    path.write_text("an earlier trace")
    written = _disk_full_after(monkeypatch, 100)
    with pytest.raises(OSError) as info:
        _trace().save(path)
    assert info.value.errno == errno.ENOSPC and written["n"] > 0  # it failed part-way
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and path.read_text() == "an earlier trace"
    monkeypatch.undo()
    _trace().save(path)  # with room, the same save works and round-trips
    assert np.array_equal(RoutingTrace.load(path).ids, _trace().ids)


def test_generate_with_a_full_disk_prints_its_answer_and_one_warning(ckpt, reference, tmp_path, monkeypatch, capsys):
    from wisp.cli import main

    path = tmp_path / "trace.npz"
    _disk_full_after(monkeypatch, 50)
    rc = main(["generate", "--model", str(ckpt), "--device", "cpu", "--expert-cap", "8", "--prompt-ids",
               ",".join(map(str, PROMPT)), "--max-tokens", "4", "--record-routing", str(path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["token_ids"] == reference
    warnings = [line for line in err.splitlines() if line.startswith("wisp: warning")]
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and str(path) in warnings[0]
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # no partial trace, no temporary file


def test_serve_shutdown_with_a_full_disk_warns_once(tmp_path, monkeypatch, capsys):
    """`wisp serve` writes its trace at shutdown, after serving: a full disk there is the same one warning."""
    from wisp.trace.recorder import save_trace

    _disk_full_after(monkeypatch, 10)
    save_trace(_trace, str(tmp_path / "serve.jsonl"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("wisp: warning: the routing trace was not written")
    assert list(tmp_path.iterdir()) == []
