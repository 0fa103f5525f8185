"""The vLLM backend, and every part of tts that reaches into a running vLLM engine.

- ``engine``: starting an engine (`make_llm`: dtype, KV budget, block size), KV facts.
- ``generator`` / ``verifier``: the `Generator` and `Verifier` backends, step by step
  through `LLMEngine` (`add_request`, `step`, `abort_request`).
- ``sampling``: the position-keyed sampler, a vLLM logits processor.
- ``stats``: per-step scheduler statistics; ``thrash``: prefix-cache hits, evictions and
  thrash counted in the block pool; ``memory_breakdown``: an engine's memory components.
- ``internals``: the one module that touches vLLM's non-public parts, and the supported
  vLLM version.

Nothing here is imported by ``import tts.backends``: vLLM loads only when an engine starts.
"""
