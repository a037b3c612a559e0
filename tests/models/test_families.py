"""The family registry: one entry per architecture, and errors that list what is supported."""

from __future__ import annotations

import pytest
import torch

from wisp.errors import WispError
from wisp.models.families import FAMILIES, Family, family_for_architecture, get_family, register
from wisp.models.weight_names import HF_STYLE


def test_each_architecture_finds_its_family():
    for name, family in FAMILIES.items():
        assert family_for_architecture(family.architecture) is family is get_family(name)
    assert get_family("mixtral").router_dtype == torch.float32 and get_family("olmoe").router_dtype is None


def test_unknown_names_list_the_supported_ones():
    with pytest.raises(WispError, match="unsupported architecture 'LlamaForCausalLM'; supported: Qwen3MoeForCausalLM"):
        family_for_architecture("LlamaForCausalLM")
    with pytest.raises(WispError, match="unsupported model family 'llama'; supported: qwen3_moe, olmoe"):
        get_family("llama")


def test_a_name_or_architecture_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        register(Family("qwen3_moe_again", "Qwen3MoeForCausalLM", HF_STYLE))
    assert "qwen3_moe_again" not in FAMILIES
