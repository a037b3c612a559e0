"""Where a model comes from: `demo` (or `demo-random`), a local directory, a GGUF file, (network permitting) a hub id, or with
`--load-format dummy` a shape preset; and its config, read without loading anything else."""

from __future__ import annotations

import os
from pathlib import Path

from wisp.config import EngineConfig, ModelConfig
from wisp.errors import WispError
from wisp.models.config_parsers import model_config, read_model_config
from wisp.models.gguf_file import is_gguf
from wisp.models.presets import PRESETS, preset


def cache_dir() -> Path:
    """Where wisp writes what it makes once and reuses: the random demo, GGUF files' tokenizer folders ($WISP_CACHE,
    default ~/.cache/wisp)."""
    return Path(os.environ.get("WISP_CACHE", Path.home() / ".cache" / "wisp"))


def model_source(config: EngineConfig) -> tuple[Path | None, ModelConfig]:
    """(checkpoint folder or GGUF file or None, config): a folder / GGUF file / 'demo' / hub id, or with --load-format
    dummy also a preset name (qwen3-30b-a3b, ...), whose weights are made up on the device. --load-format safetensors
    or gguf names the format the checkpoint must be in."""
    if config.model in PRESETS:
        if config.load_format != "dummy":
            raise WispError(f"{config.model} is a shape preset with no weights: use --load-format dummy")
        return None, model_config(preset(config.model))
    path = resolve_model_path(config.model)
    found = "gguf" if is_gguf(path) else "safetensors"
    if config.load_format in ("safetensors", "gguf") and config.load_format != found:
        raise WispError(f"--load-format {config.load_format} does not read {path}: it is a "
                        f"{'GGUF file' if found == 'gguf' else 'checkpoint directory'} (--load-format auto reads it)")
    return path, read_model_config(path)


def resolve_model_path(model: str | Path) -> Path:
    from wisp.models.demo import NAMES, demo_path

    if str(model) in NAMES:
        return demo_path(str(model))
    path = Path(model).expanduser()
    if path.is_dir() or (is_gguf(path) and path.is_file()):
        return path
    if path.exists():
        raise WispError(f"model path {path} is neither a checkpoint directory nor a .gguf file")
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not is_gguf(path):
        return _from_hub(text)
    raise WispError(f"{'GGUF file' if is_gguf(path) else 'model directory'} {path} does not exist")


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise WispError(f"{repo_id} is not a local directory, and huggingface_hub is not installed to fetch it") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as exc:  # network, auth, missing repo: all reported the same way
        raise WispError(f"could not fetch {repo_id} from the hub: {exc.__class__.__name__}: {exc}") from None
