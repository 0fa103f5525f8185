"""tts's vLLM plugin: the PRM architectures vLLM lacks (`prm_models.py`).

`register` is the entry point of the `vllm.general_plugins` group (pyproject.toml), so vLLM
calls it in every process that builds an engine, GPU workers included. The classes are
registered by name, so nothing heavy is imported until an engine needs one, and an
architecture this vLLM already knows is left to vLLM.
"""

from __future__ import annotations

ARCHITECTURES: dict[str, str] = {
    "Qwen2ForPrmModel": "tts.backends.vllm.prm_models:Qwen2ForPrmModel",  # Skywork-o1-Open-PRM
}


def register() -> None:
    """Register every architecture above that this vLLM does not have (any number of
    times, in any process)."""
    from vllm import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in known:
            ModelRegistry.register_model(arch, target)
