"""The model backends the engine talks to (`base.py`, the contracts): vLLM's (`vllm/`), the
deterministic fake for unit tests (`fake.py`), and how a config builds them (`factory.py`)."""
