"""Benchmarks that are not a search run: `ceiling` (the generator path against raw vLLM)."""
