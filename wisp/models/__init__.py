"""Model code: the family registry, the generic MoE decoder, checkpoint loading, random checkpoints."""

from wisp.models.source import resolve_model_path

__all__ = ["resolve_model_path"]
