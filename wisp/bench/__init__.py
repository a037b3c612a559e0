"""Benchmarks run by `wisp bench` (their results are kept under benchmarks/results/)."""
