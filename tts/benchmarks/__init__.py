"""Benchmarks that are not a search run: `ceiling` (the generator path against raw vLLM)
and `allocator_timing` (the roofline allocation search's own speed)."""
