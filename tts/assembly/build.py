"""One variant's engine: its typed options (`tts.engine.options`), backends sized for it,
and, with M, the memory policy that re-plans the models' batch caps; each decided on the
card a run is recorded for where it names one (`tts.assembly.card`)."""

from __future__ import annotations

import dataclasses

from tts.assembly.card import CardStepPrice, card_config, in_run_tokens
from tts.backends.factory import Backends, read_prompt, static_split
from tts.config.enums import BackendKind, EngineKind
from tts.config.schema import Config, OptimConfig, SearchConfig
from tts.engine.engine import Engine
from tts.engine.options import EngineOptions, VerifierShape, options_for
from tts.search import make_policy


def engine_options(cfg: Config, optim: OptimConfig) -> EngineOptions:
    """The engine's typed options for `optim` in this run (`tts.engine.options`), the
    speculation width and the verifier it decides for those of the card it is recorded
    for (`card_config`, `verifier_shape`)."""
    return options_for(
        optim, concurrency=cfg.bench.concurrency, seed=cfg.bench.seed,
        spec_batch_cap=spec_batch_cap(card_config(cfg), optim),
        temperature=cfg.generator.temperature if cfg.search.temperature is None else cfg.search.temperature,
        top_p=cfg.generator.top_p, fresh_cache_per_problem=cfg.bench.fresh_cache_per_problem,
        verifier_shape=verifier_shape(cfg))


def verifier_shape(cfg: Config) -> VerifierShape | None:
    """How the verifier the engine decides for asks (`EngineOptions.verifier_shape`): the
    adapter's of the card's pair where the run is recorded for a card (`card_config`: a
    judge here scoring for Skywork's value head looks ahead as Skywork would), else of the
    run's own verifier. Recorded with the options, so a replay that simulates a verifier
    of another shape says so. None for the fake backend's, which tells its own."""
    verifier = card_config(cfg).verifier
    if verifier.backend is not BackendKind.vllm:
        return None
    from tts.backends.adapters import adapter_class

    adapter = adapter_class(verifier.adapter.value)
    return VerifierShape(adapter.request_per_index, adapter.reads_partial_steps)


def spec_batch_cap(cfg: Config, optim: OptimConfig) -> int:
    """optim.spec_batch_cap, with -1 resolved to the decode ridge batch: the batch at
    which a decode step turns from reading the weights (memory-bound) to computing
    (compute-bound), i.e. the device's ridge point in FLOP/byte x bytes per weight / 2."""
    if optim.spec_batch_cap >= 0 or not optim.speculative:
        return max(0, optim.spec_batch_cap)
    if cfg.generator.backend is not BackendKind.vllm:
        return 0
    from tts.assembly.memory_split import device_profile, model_shape

    shape = model_shape(cfg.generator.model, cfg.generator.dtype)
    return max(1, round(device_profile(cfg).ridge_point * shape.dtype_bytes / 2))


def build_engine(cfg: Config, optim: OptimConfig, backends: Backends, search: SearchConfig | None = None):
    """The engine for one variant (searching with `search`, default `cfg.search`), on
    backends sized for it: for the card and pair it is recorded for, where it names one
    (`card_config`), its engines holding the tokens theirs would (`in_run_tokens`) and its
    generator's steps priced there (`CardStepPrice`)."""
    from tts.assembly.memory_split import plan_memory

    if search is not None and search != cfg.search:
        cfg = dataclasses.replace(cfg, search=search)
    card = card_config(cfg)
    # M needs real model shapes; the fake backend has none, so it keeps the static split
    roofline = optim.roofline_memory and card.generator.backend is BackendKind.vllm
    gen_spec, ver_spec = plan_memory(card, optim) if roofline else static_split(card)
    policy = lambda: make_policy(cfg.search, cfg.generator.step_max_tokens, cfg.generator.max_total_tokens)
    uses_verifier = policy().uses_verifier
    gen, ver = backends.get(in_run_tokens(cfg, card, "generator", gen_spec),
                            in_run_tokens(cfg, card, "verifier", ver_spec) if uses_verifier else None)
    if card is not cfg:
        CardStepPrice.of(card).attach(gen)
    if roofline:  # the engines' slots leave room for re-plans; start at the split's caps
        from tts.assembly.memory_split import initial_caps

        gen_cap, ver_cap = initial_caps(card, gen_spec.kv_bytes, ver_spec.kv_bytes)
        gen.set_limits(batch_cap=gen_cap)
        if ver is not None:
            ver.set_limits(batch_cap=ver_cap)
    allocator = None
    if roofline:  # the memory policy (M), whatever the schedule
        from tts.assembly.memory_split import RuntimeAllocator
        allocator = RuntimeAllocator(card, gen, ver, gen_spec.kv_bytes, ver_spec.kv_bytes)
    schedule = "decoupled" if optim.engine is EngineKind.decoupled else "barrier"
    engine = Engine(gen, ver, policy, read_prompt(cfg.generator.system_prompt_file), engine_options(cfg, optim),
                    schedule, replan=allocator)
    if allocator is not None:
        engine.log_sources["memory_split"] = allocator.summary  # M's caps, in step_logs.json
    return engine
