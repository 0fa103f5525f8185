"""A run's KV budget: the card's free memory less what the models take, or a share of the
search's working set.

`tts bench` on a CUDA host with `memory.gpu_free_fraction` set sizes the engines' KV cache
from the card itself (`tts.assembly.memory_split.gpu_kv_budget`) instead of a fixed
`memory.kv_cache_gib`; the run folder's config records the budget used, and `--resume`
keeps it. With `memory.working_set_fraction` the budget is that share of the search's KV
working set (`tts.assembly.memory_split.working_set_bytes`), on any host. A run recorded
for a card (`bench.record_for`) takes the budget a replay on that card takes
(`kv_for_the_card`, `kv_of_the_card`), and its engines hold that budget's tokens
(`tts.assembly.card`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from tts.config.compose import ConfigError, validate
from tts.config.enums import BackendKind
from tts.results.store import RunStore

log = logging.getLogger(__name__)


def kv_on_this_gpu(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `memory.kv_cache_gib` the GPU's free memory less the models and their
    activations (`memory.gpu_free_fraction`, `tts.assembly.memory_split.gpu_kv_budget`), for
    a vLLM run on a CUDA host; a resumed run keeps the budget its first part took. The run
    folder's config records the budget used. Unchanged on CPU or with the share null."""
    backend = cfg_node.generator.backend
    if cfg_node.memory.get("gpu_free_fraction") is None or getattr(backend, "value", backend) != BackendKind.vllm.value:
        return cfg_node
    from tts.backends.factory import models_on_cuda
    from tts.backends.vllm.engine import gpu_free_bytes

    if not models_on_cuda(cfg_node):
        return cfg_node
    import copy

    from tts.backends.factory import GIB
    from tts.assembly.memory_split import gpu_kv_budget

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


def kv_budget(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `memory.kv_cache_gib` the budget the run gets: `memory.working_set_fraction`
    of the search's working set where it is set (`kv_of_working_set`, at most what the GPU
    has), else the GPU's share (`kv_on_this_gpu`), else unchanged."""
    gpu = kv_on_this_gpu(cfg_node)
    return kv_of_working_set(cfg_node, gpu.memory.kv_cache_gib if gpu is not cfg_node else None) \
        if cfg_node.memory.get("working_set_fraction") is not None else gpu


def kv_for_the_card(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `memory.kv_cache_gib` the KV budget of the card its `bench.record_for`
    names, for the pair it names, as a replay there takes it (`kv_of_working_set`, then
    `kv_of_the_card`, on `tts.assembly.card.card_node`); unchanged without a card. The run
    folder's config records it."""
    if cfg_node.bench.record_for.device is None:
        return cfg_node
    import copy

    from tts.assembly.card import card_node

    card = kv_of_working_set(card_node(cfg_node))
    kv_of_the_card(card, [])
    cfg_node = copy.deepcopy(cfg_node)
    cfg_node.memory.kv_cache_gib = card.memory.kv_cache_gib
    return cfg_node


def kv_of_working_set(cfg_node: DictConfig, most_gib: float | None = None) -> DictConfig:
    """`cfg_node` with `memory.kv_cache_gib` `memory.working_set_fraction` of the search's KV
    working set (`tts.assembly.memory_split.working_set_bytes`, with the config's models and
    dtypes: a replay's, for a replay); unchanged with the fraction null. ValueError when it
    is more than `most_gib` (what a GPU has)."""
    fraction = cfg_node.memory.get("working_set_fraction")
    if fraction is None:
        return cfg_node
    import copy

    from tts.backends.factory import GIB
    from tts.assembly.memory_split import working_set_bytes

    working_set = working_set_bytes(validate(cfg_node)) / GIB
    gib = fraction * working_set
    if most_gib is not None and gib > most_gib:
        raise ValueError(f"memory.working_set_fraction={fraction}: {gib:.2f} GiB of the working set's "
                         f"{working_set:.2f} GiB is more than the {most_gib:.2f} GiB of KV cache "
                         "this GPU has (memory.gpu_free_fraction); lower the fraction, search.n or "
                         "generator.max_total_tokens")
    cfg_node = copy.deepcopy(cfg_node)
    cfg_node.memory.kv_cache_gib = round(gib, 6)
    return cfg_node


def kv_of_the_card(cfg: DictConfig, overrides: list[str]) -> None:
    """On a GPU device, the KV budget a real run there would take (`tts.assembly.memory_split.
    gpu_kv_budget`): `memory.gpu_free_fraction` of the card's memory, less both models'
    weights and activations, so memory pressure arrives at large n as it does on the card.
    Kept as it is when the overrides name `memory.kv_cache_gib`, with no share
    (`memory.gpu_free_fraction=null`), a share of the working set instead
    (`memory.working_set_fraction`), or on a CPU."""
    named = any(o.split("=", 1)[0].lstrip("+") == "memory.kv_cache_gib" for o in overrides)
    if cfg.device.kind != "gpu" or cfg.memory.gpu_free_fraction is None or named or cfg.memory.working_set_fraction:
        return
    from tts.assembly.memory_split import gpu_kv_budget
    from tts.backends.factory import GIB

    try:
        budget = gpu_kv_budget(validate(cfg), int(cfg.device.memory_gb * 1e9))
    except ValueError as err:
        raise ConfigError(f"device={cfg.device.name}: {err}") from err
    cfg.memory.kv_cache_gib = round(budget / GIB, 3)
