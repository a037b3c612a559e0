"""The engine: sampling parameters, per-sequence KV, and the generate loop behind `LLM`."""
