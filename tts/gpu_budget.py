"""A run's KV budget on a GPU: the card's free memory less what the models take.

`tts bench` on a CUDA host with `memory.gpu_free_fraction` set sizes the engines' KV cache
from the card itself (`tts.engine.memory_split.gpu_kv_budget`) instead of a fixed
`memory.kv_cache_gib`; the run folder's config records the budget used, and `--resume`
keeps it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from tts.config.compose import validate
from tts.config.schema import BackendKind
from tts.results.store import RunStore

log = logging.getLogger(__name__)


def kv_on_this_gpu(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `memory.kv_cache_gib` the GPU's free memory less the models and their
    activations (`memory.gpu_free_fraction`, `tts.engine.memory_split.gpu_kv_budget`), for
    a vLLM run on a CUDA host; a resumed run keeps the budget its first part took. The run
    folder's config records the budget used. Unchanged on CPU or with the share null."""
    backend = cfg_node.generator.backend
    if cfg_node.memory.get("gpu_free_fraction") is None or getattr(backend, "value", backend) != BackendKind.vllm.value:
        return cfg_node
    from tts.backends.vllm.engine import gpu_free_bytes, has_cuda

    if not has_cuda():
        return cfg_node
    import copy

    from tts.backends.factory import GIB
    from tts.engine.memory_split import gpu_kv_budget

    gib = _resumed_kv(cfg_node)
    if gib is None:
        free = gpu_free_bytes()
        gib = gpu_kv_budget(validate(cfg_node), free) / GIB
        log.warning("memory.gpu_free_fraction=%s: KV budget %.2f GiB of the GPU's %.2f GiB free",
                    cfg_node.memory.gpu_free_fraction, gib, free / GIB)
    cfg_node = copy.deepcopy(cfg_node)
    cfg_node.memory.kv_cache_gib = gib
    return cfg_node


def _resumed_kv(cfg_node: DictConfig) -> float | None:
    """The KV budget a resumed run's first part took from the GPU with the same share."""
    if not (cfg_node.bench.resume and cfg_node.bench.run_name):
        return None
    saved = RunStore(Path(cfg_node.bench.results_dir) / cfg_node.bench.run_name).saved_config().get("memory")
    if not isinstance(saved, dict) or saved.get("gpu_free_fraction") != cfg_node.memory.gpu_free_fraction:
        return None
    return saved.get("kv_cache_gib")
