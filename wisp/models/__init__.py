"""Model code: the family registry, config parsing, the generic MoE decoder, checkpoint loading, random checkpoints.

Nothing is imported here: `wisp --help` imports `wisp.models.presets` without torch, which an eager import
of the rest would load. A checkpoint's config is read through `wisp.models.config_parsers`."""
