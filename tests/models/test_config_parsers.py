"""wisp.models.config_parsers: one entry point, one registered parser per config format."""

from __future__ import annotations

import pytest

from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.hf_config import parse_hf_config
from wisp.models.demo import DEMO_CONFIG


def test_the_default_format_is_hugging_face_and_others_list_the_supported_ones():
    assert model_config(DEMO_CONFIG) == model_config(DEMO_CONFIG, fmt="hf") == parse_hf_config(DEMO_CONFIG)
    with pytest.raises(WispError, match="unknown config format 'onnx'; supported: hf, gguf"):
        model_config(DEMO_CONFIG, fmt="onnx")
    with pytest.raises(WispError, match="unsupported GGUF architecture ''; supported: qwen3moe, olmoe, llama, qwen2moe"):
        model_config(DEMO_CONFIG, fmt="gguf")  # a config.json is no GGUF metadata
