"""The plug-in's settings and version gate (no vLLM needed: these run in every environment)."""

from __future__ import annotations

import pytest

from wisp.integrations.vllm.settings import (
    UnsupportedVllmVersion, WispSettings, WispVllmConfigError, check_vllm_version, layer_index_of, settings_from,
)


def test_no_wisp_table_is_off():
    assert settings_from(None) is None and settings_from({}) is None and settings_from({"other": 1}) is None


def test_one_cap_for_every_layer_clipped_to_the_experts():
    s = settings_from({"wisp": {"mode": "paged", "expert_cap": 4}})
    assert s == WispSettings("paged", 4) and s.cap_for(0, 8, 2) == 4 and s.cap_for(7, 3, 2) == 3
    assert settings_from({"wisp": {"expert_cap": 4}}).paged  # paged is the default mode


def test_per_layer_caps_leave_other_layers_resident():
    s = settings_from({"wisp": {"mode": "paged", "expert_cap": {"0": 2, 2: 8}}})
    assert s.layer_caps == {0: 2, 2: 8}
    assert [s.cap_for(i, 8, 2) for i in (0, 1, 2, None)] == [2, None, 8, None]


def test_a_plan_pages_and_leaves_the_caps_to_the_model():
    s = settings_from({"wisp": {"plan": "plans/qwen3.json"}})
    assert s == WispSettings("paged", plan="plans/qwen3.json") and s.layer_caps == {} and s.expert_cap is None


def test_resident_mode_pages_nothing():
    assert settings_from({"wisp": {"mode": "resident"}}).cap_for(0, 8, 2) is None


@pytest.mark.parametrize("table, message", [
    ({"mode": "zero-copy", "expert_cap": 2}, "unknown wisp mode 'zero-copy'"),
    ({"mode": "paged"}, 'needs "expert_cap".*or "plan"'),
    ({"expert_cap": 0}, "positive int"),
    ({"expert_cap": True}, "positive int"),
    ({"expert_cap": {"first": 2}}, "decoder layer indices"),
    ({"expert_cap": 2, "policy": "lru"}, "unknown key"),
    ({"expert_cap": 2, "plan": "plan.json"}, '"plan" and "expert_cap" both set the expert caps: give one'),
    ({"expert_cap": {"0": 2}, "plan": "plan.json"}, "give one"),
    ({"mode": "resident", "plan": "plan.json"}, 'use mode "paged" with it'),
    ({"plan": ""}, "must be the path of a `wisp plan` file"),
    ({"plan": 3}, "must be the path"),
    ("paged", "must be a table"),
])
def test_bad_settings_give_one_clear_error(table, message):
    with pytest.raises(WispVllmConfigError, match=message):
        settings_from({"wisp": table})


def test_a_cap_below_top_k_is_refused_naming_top_k():
    with pytest.raises(WispVllmConfigError, match="below the model's top_k 2.*expert_cap >= 2"):
        settings_from({"wisp": {"expert_cap": 1}}).cap_for(0, 8, 2)
    with pytest.raises(WispVllmConfigError, match=r"\(layer 3\)"):
        settings_from({"wisp": {"expert_cap": {3: 1}}}).cap_for(3, 8, 2)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.4", "0.32.0+cpu"])
def test_supported_versions_pass(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "dev"])
def test_other_versions_name_the_supported_range(version):
    with pytest.raises(UnsupportedVllmVersion, match=rf">=0.32,<0.33.*found vllm {version}"):
        check_vllm_version(version)


def test_layer_index_from_vllm_layer_names():
    assert layer_index_of("model.layers.3.mlp.experts.routed_experts") == 3
    assert layer_index_of("layers.0.mlp.experts") == 0
    assert layer_index_of("lm_head") is None
