"""Applying a plan to a running engine (`wisp.engine.warmup`): from the built-in warm-up, and from a
plan file checked before it is applied."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.warmup import plan_from_file, plan_from_warmup
from wisp.errors import WispError


def test_apply_plan_and_warmup_keep_outputs_identical(tmp_path):
    engine = LLMEngine(EngineConfig(model="demo", device="cpu", mode="paged", expert_cap=8, max_model_len=256))
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    def run(rid: str) -> list[int]:
        engine.add_request(rid, [5, 6, 7, 8, 9], params)
        seq = engine.requests[rid]
        while engine.has_unfinished():
            engine.step()
        return seq.output_ids

    before = run("a")
    plan = plan_from_warmup(engine, 1 << 30)
    assert plan.kv_blocks >= plan.report.admission_floor_blocks
    engine.apply_plan([4, 6, 8, 16], 80)
    assert engine.stats()["expert_caps"] == {"0": 4, "1": 6, "2": 8, "3": 16} and engine.pool.num_blocks == 80
    assert run("b") == before
    engine.apply_plan(list(plan.per_layer_caps), plan.kv_blocks)
    assert run("c") == before
    with pytest.raises(WispError, match="out of range"):
        engine.apply_plan([2, 4, 4, 4], 80)
    with pytest.raises(WispError, match="needs"):
        engine.apply_plan([4, 4, 4, 4], 10)
    (tmp_path / "p.json").write_text(json.dumps({"expert_cap": 4}))
    with pytest.raises(WispError, match="per_layer_caps"):
        plan_from_file(str(tmp_path / "p.json"))
    assert np.all(np.array(plan.per_layer_caps) >= 4)


def test_plan_files_are_checked_before_they_are_applied(tmp_path):
    def write(obj) -> str:
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(obj))
        return str(path)

    good = {"per_layer_caps": [4, 4], "kv_blocks": 64, "kv_block_size": 16}
    assert plan_from_file(write(good), 16).kv_blocks == 64
    with pytest.raises(WispError, match="64-token KV blocks"):
        plan_from_file(write({**good, "kv_block_size": 64}), 16)
    with pytest.raises(WispError, match="integer"):
        plan_from_file(write({**good, "kv_blocks": 64.0}), 16)
    with pytest.raises(WispError, match="not a JSON object"):
        plan_from_file(write([1, 2]), 16)
