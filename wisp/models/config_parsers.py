"""The one way in to a `ModelConfig` from a checkpoint's own config: one registered parser per format.

`model_config(raw)` parses a config dict (by default a Hugging Face config.json's; `fmt` names another
registered format), `read_model_config(path)` a checkpoint folder's config files. Every parser looks the
model's family up in `wisp.models.families` and lets it read its own quirks, so the model code sees plain
`ModelConfig` fields whatever the format. A new format (a GGUF reader, say) adds its parser to `PARSERS`,
and its files to `read_model_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.models.gguf_config import parse_gguf_metadata
from wisp.models.gguf_file import GGUFFile, is_gguf
from wisp.models.hf_config import parse_hf_config, read_hf_config

# a format's config dict and its generation settings (or None) -> the model's config
ConfigParser = Callable[[dict[str, Any], dict[str, Any] | None], ModelConfig]
PARSERS: dict[str, ConfigParser] = {"hf": parse_hf_config, "gguf": parse_gguf_metadata}


def model_config(raw: dict[str, Any], generation: dict[str, Any] | None = None, fmt: str = "hf") -> ModelConfig:
    """The config of a checkpoint whose config dict in format `fmt` is `raw` (and generation settings
    `generation`); an unknown format, family, quantization or rope type is a WispError naming the supported ones."""
    if fmt not in PARSERS:
        raise WispError(f"unknown config format {fmt!r}; supported: {', '.join(PARSERS)}")
    return PARSERS[fmt](raw, generation)


def read_model_config(path: str | Path) -> ModelConfig:
    """The config of the checkpoint folder `path` (config.json, and generation_config.json when present), or of
    the GGUF file `path` (its metadata); a missing or malformed file is a WispError naming it."""
    if is_gguf(path):
        file = GGUFFile(path)
        return parse_gguf_metadata(file.metadata, experts=file.expert_facts())
    return read_hf_config(path)
