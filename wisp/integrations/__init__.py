"""Front ends that run wisp's core inside other serving engines. Nothing else in wisp imports this package,
and each engine's module imports that engine only when the engine itself loads it (an entry point)."""
