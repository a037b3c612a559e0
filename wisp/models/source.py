"""Where a model comes from: `demo`, a local directory, or (network permitting) a hub id."""

from __future__ import annotations

from pathlib import Path

from wisp.errors import WispError


def resolve_model_path(model: str | Path) -> Path:
    if str(model) == "demo":
        from wisp.models.random_checkpoint import demo_path

        return demo_path()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise WispError(f"model path {path} is not a directory")
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return _from_hub(text)
    raise WispError(f"model directory {path} does not exist")


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise WispError(f"{repo_id} is not a local directory, and huggingface_hub is not installed to fetch it") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))
    except Exception as exc:  # network, auth, missing repo: all reported the same way
        raise WispError(f"could not fetch {repo_id} from the hub: {exc.__class__.__name__}: {exc}") from None
