"""tts: verifier-guided test-time scaling on vLLM: the engine, its search policies, backends,
memory model, metrics, results and trace replay."""
