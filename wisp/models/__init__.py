"""Model code: the family registry, the generic MoE decoder, checkpoint loading, random checkpoints.

Nothing is imported here: `wisp.config` imports the family registry, and `wisp.models.source` imports
`wisp.config`, so an eager import would be a cycle."""
