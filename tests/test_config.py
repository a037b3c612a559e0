"""EngineConfig: the engine's options, validated once and resolved against a model's config."""

from __future__ import annotations

import pytest
import torch

from wisp.config import EngineConfig
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.demo import DEMO_CONFIG


def test_expert_bytes_and_default_caps():
    cfg = model_config(DEMO_CONFIG)
    assert cfg.expert_bytes == 3 * 128 * 64 * 4
    assert EngineConfig(model="demo", mode="paged").resolve_cap(cfg) == 8
    assert EngineConfig(model="demo", mode="resident").resolve_cap(cfg) == 16
    with pytest.raises(WispError, match="between top_k=4 and num_experts=16"):
        EngineConfig(model="demo", expert_cap=3).resolve_cap(cfg)
    assert EngineConfig(model="demo", mode="hybrid", expert_cap=0).resolve_cap(cfg) == 0  # no slots: read in place
    with pytest.raises(WispError, match=r"expert cap 0 is out of range: it must be between top_k=4 and num_experts=16$"):
        EngineConfig(model="demo", mode="paged", expert_cap=0).resolve_cap(cfg)
    with pytest.raises(WispError, match=r"num_experts=16 \(or --mode hybrid-zero-copy, with no slots\)"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=2).resolve_cap(cfg)


def test_bad_engine_options():
    with pytest.raises(WispError, match="unknown mode"):
        EngineConfig(model="demo", mode="swap")
    with pytest.raises(WispError, match="dtype"):
        EngineConfig(model="demo", dtype="int3")


def test_backends_resolve_per_device_and_refuse_what_cannot_run():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg = EngineConfig(model="demo")
    assert cfg.resolve_backend("moe", cpu) == "torch" and cfg.resolve_backend("attention", cuda) == "triton"
    with pytest.raises(WispError, match="needs a CUDA device"):
        EngineConfig(model="demo", moe_backend="triton").resolve_backend("moe", cpu)
    with pytest.raises(WispError, match="zero-copy"):
        EngineConfig(model="demo", mode="zero-copy", moe_backend="torch").resolve_backend("moe", cuda)
    assert EngineConfig(model="demo", mode="zero-copy").resolve_backend("moe", cpu) == "torch"
    with pytest.raises(WispError, match="pinned"):
        EngineConfig(model="demo", mode="zero-copy", pin_memory=False).resolve_backend("moe", cuda)
    with pytest.raises(WispError, match="--mode hybrid-zero-copy reads experts from host memory in place"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=0, moe_backend="torch").resolve_backend("moe", cuda)
    assert EngineConfig(model="demo", mode="hybrid", expert_cap=2, moe_backend="torch").resolve_backend("moe", cuda) == "torch"
    with pytest.raises(WispError, match="cuda-graph-max-batch"):
        EngineConfig(model="demo", cuda_graph_max_batch=-1)


def test_hybrid_zero_copy_has_a_name_and_the_old_spelling_still_works(caplog):
    with caplog.at_level("WARNING", logger="wisp"):
        old = EngineConfig(model="demo", mode="hybrid", expert_cap=0)
    assert (old.mode, old.expert_cap) == ("hybrid-zero-copy", 0) and "deprecated" in caplog.text
    new = EngineConfig(model="demo", mode="hybrid-zero-copy", hot_experts=2)
    assert (new.mode, new.expert_cap, new.reads_in_place) == ("hybrid-zero-copy", 0, True)
    with pytest.raises(WispError, match="keeps no expert slots"):
        EngineConfig(model="demo", mode="hybrid-zero-copy", expert_cap=4)
    with pytest.raises(WispError, match="needs --mode hybrid-zero-copy"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=2, hot_experts=1)


@pytest.mark.parametrize("value", ["maybe", "width:0", "width:", "width:x", "ON"])
def test_an_unknown_load_control_is_one_clear_error(value):
    with pytest.raises(WispError, match="choose one of: on, off, width:N"):
        EngineConfig(model="demo", load_control=value)


def test_load_control_settings_are_kept_in_one_spelling():
    assert EngineConfig(model="demo", load_control="width:02").load_control == "width:2"
    assert EngineConfig(model="demo", load_control="off").load_control == "off"
    with pytest.raises(WispError, match="max-decode-wait-ms must be > 0"):
        EngineConfig(model="demo", max_decode_wait_ms=0)


@pytest.mark.parametrize("mode", ["resident", "offload", "zero-copy"])
def test_an_expert_cap_in_a_mode_without_slots_is_said_to_do_nothing(caplog, mode):
    with caplog.at_level("WARNING"):
        EngineConfig(model="demo", mode=mode, expert_cap=5)
    assert f"--expert-cap 5 does nothing in --mode {mode}" in caplog.text and "paged and hybrid" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        EngineConfig(model="demo", mode=mode)
        EngineConfig(model="demo", mode="paged", expert_cap=5)
    assert "does nothing" not in caplog.text
