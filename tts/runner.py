"""`tts bench`: run one or more engine variants over a problem set and record everything.

Variants (`bench.compare`, else the configured `optim`) run one after another in this
process, over the same problems with the same seeds, sharing the loaded models. Each
problem runs once per seed of `bench.seeds` (default `[bench.seed]`); a record carries its
seed, so records and a resume are keyed by (variant, problem, seed).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tts import clock
from tts.backends.factory import Backends, read_prompt, static_split
from tts.backends.vllm.thrash import attach_counters, detach_counters
from tts.config.compose import CONF_DIR, ConfigError, preset_optims, to_yaml, validate
from tts.config.limits import check_context
from tts.config.schema import BackendKind, BenchMode, Config, EngineKind, OptimConfig, SearchConfig
from tts.engine.adaptive import AdaptiveOptions
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.kv_budget import kv_budget
from tts.metrics.collector import KV_BLOCKS, merge_step_logs
from tts.problems import fit_prompts, load_problems_for
from tts.replay.trace import TRACE, TraceRecorder
from tts.results.records import build_record
from tts.results.store import RunStore
from tts.results.summary import variant_wall, write_summary
from tts.results.wandb_logger import RunLogger
from tts.search import make_policy

log = logging.getLogger(__name__)


def variant_optims(cfg: Config) -> list[tuple[str, OptimConfig]]:
    """(name, optim config) for each variant: the `bench.compare` presets, each with
    `bench.optim_overrides` on top, else the one configured."""
    if not cfg.bench.compare:
        return [(_preset_name(cfg.optim), cfg.optim)]
    return preset_optims(list(cfg.bench.compare), list(cfg.bench.optim_overrides))


def run_variants(cfg: Config) -> list[tuple[str, OptimConfig, SearchConfig]]:
    """Every variant the run compares, in order: (name, optim, search). The optim variants
    (`variant_optims`) search with `cfg.search`; then each `bench.search_variants` preset
    runs on the baseline engine at `cfg.search.n`."""
    from tts.config.compose import preset_searches

    out = [(name, optim, cfg.search) for name, optim in variant_optims(cfg)]
    if cfg.bench.search_variants:
        baseline = preset_optims(["baseline"], [])[0][1]
        taken = {name for name, _, _ in out}
        for name, search in preset_searches(list(cfg.bench.search_variants), cfg.search.n):
            if name in taken:
                raise ConfigError(f"bench.search_variants: {name!r} is also an optim variant's name")
            out.append((name, baseline, search))
    return out


def _preset_name(optim: OptimConfig) -> str:
    """The `conf/optim` preset `optim` is, else a label of its engine and switches."""
    for name in sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml")):
        if preset_optims([name], [])[0][1] == optim:
            return name
    if optim.engine is EngineKind.baseline:
        return "baseline"
    if optim.engine is EngineKind.decoupled:
        return f"decoupled-{optim.decoupled_policy.value}"
    flags = "P" * optim.prefix_aware + "M" * optim.roofline_memory + "S" * optim.speculative
    return (flags or "flash") + "_branches" * optim.spec_branches


def engine_options(cfg: Config, optim: OptimConfig) -> EngineOptions:
    return EngineOptions(
        concurrency=cfg.bench.concurrency, seed=cfg.bench.seed, score_cache=optim.score_cache,
        eos_at_depth_limit=optim.eos_at_depth_limit, speculative=optim.speculative,
        lookahead=optim.lookahead, lookahead_scope=optim.lookahead_scope,
        ordering="prefix_aware" if optim.prefix_aware else optim.request_order,
        spec_max_tokens=optim.spec_max_tokens, spec_batch_cap=spec_batch_cap(cfg, optim),
        spec_truncate_ratio=optim.spec_truncate_ratio,
        spec_truncate_std=optim.spec_truncate_std, spec_own_min_tokens=optim.spec_own_min_tokens, spec_branches=optim.spec_branches, spec_prune=optim.spec_prune,
        temperature=cfg.generator.temperature if cfg.search.temperature is None else cfg.search.temperature,
        top_p=cfg.generator.top_p, fresh_cache_per_problem=cfg.bench.fresh_cache_per_problem,
        adaptive=AdaptiveOptions(
            early_exit=optim.early_exit, exit_top=optim.exit_top, exit_agree=optim.exit_agree,
            exit_patience=optim.exit_patience, exit_plateau=optim.exit_plateau, early_reject=optim.early_reject,
            reject_interval=optim.reject_interval, reject_margin=optim.reject_margin))


def spec_batch_cap(cfg: Config, optim: OptimConfig) -> int:
    """optim.spec_batch_cap, with -1 resolved to the decode ridge batch: the batch at
    which a decode step turns from reading the weights (memory-bound) to computing
    (compute-bound), i.e. the device's ridge point in FLOP/byte x bytes per weight / 2."""
    if optim.spec_batch_cap >= 0 or not optim.speculative:
        return max(0, optim.spec_batch_cap)
    if cfg.generator.backend is not BackendKind.vllm:
        return 0
    from tts.engine.memory_split import device_profile, model_shape

    shape = model_shape(cfg.generator.model, cfg.generator.dtype)
    return max(1, round(device_profile(cfg).ridge_point * shape.dtype_bytes / 2))


def build_engine(cfg: Config, optim: OptimConfig, backends: Backends, search: SearchConfig | None = None):
    """The engine for one variant (searching with `search`, default `cfg.search`), on
    backends sized for it."""
    from tts.engine.memory_split import plan_memory

    if search is not None and search != cfg.search:
        cfg = dataclasses.replace(cfg, search=search)

    # M needs real model shapes; the fake backend has none, so it keeps the static split
    roofline = optim.roofline_memory and cfg.generator.backend is BackendKind.vllm
    gen_spec, ver_spec = plan_memory(cfg, optim) if roofline else static_split(cfg)
    policy = lambda: make_policy(cfg.search, cfg.generator.step_max_tokens, cfg.generator.max_total_tokens)
    uses_verifier = policy().uses_verifier
    gen, ver = backends.get(gen_spec, ver_spec if uses_verifier else None)
    if roofline:  # the engines' slots leave room for re-plans; start at the split's caps
        from tts.engine.memory_split import initial_caps

        gen_cap, ver_cap = initial_caps(cfg, gen_spec.kv_bytes, ver_spec.kv_bytes)
        gen.set_limits(batch_cap=gen_cap)
        if ver is not None:
            ver.set_limits(batch_cap=ver_cap)
    system = read_prompt(cfg.generator.system_prompt_file)
    if optim.engine is EngineKind.decoupled:
        engine = Engine(gen, ver, policy, system, engine_options(cfg, optim), schedule="decoupled", optim=optim)
    else:
        engine = Engine(gen, ver, policy, system, engine_options(cfg, optim))
    if roofline:  # the memory policy (M), whatever the schedule
        from tts.engine.memory_split import RuntimeAllocator
        engine.on_iteration = allocator = RuntimeAllocator(cfg, gen, ver, gen_spec.kv_bytes, ver_spec.kv_bytes)
        engine.log_sources["memory_split"] = allocator.summary  # M's caps, in step_logs.json
    return engine


def resolved_dtypes(cfg: Config) -> dict[str, str]:
    """The dtype each model runs in (`dtype: auto` resolved for this host)."""
    from tts.backends.vllm.engine import read_hf_config, resolve_dtype
    from tts.models.resolve import resolve_model

    out = {}
    for role, model in (("generator", cfg.generator), ("verifier", cfg.verifier)):
        if model.backend is BackendKind.fake:
            out[role] = "fake"
        else:
            out[role] = resolve_dtype(model.dtype, read_hf_config(resolve_model(model.model)))
    return out


def run_host(cfg: Config) -> dict:
    """This run's host, with its models' dtypes, the generator's sampler and vLLM's model
    runner."""
    from tts.backends.factory import resolve_sampler
    from tts.results.host import host_info

    return host_info(resolved_dtypes(cfg), resolve_sampler(cfg).value, model_runner(cfg))


def model_runner(cfg: Config) -> str | None:
    """The vLLM model runner the run's engines get, pinned to V1 before any engine starts
    where the generator installs the position sampler (`tts.backends.vllm.model_runner`);
    None without a vLLM model."""
    if BackendKind.vllm not in (cfg.generator.backend, cfg.verifier.backend):
        return None
    from tts.backends.factory import resolve_sampler
    from tts.backends.vllm.model_runner import pin_for_sampler
    from tts.config.schema import Sampler

    position = cfg.generator.backend is BackendKind.vllm and resolve_sampler(cfg) is Sampler.position
    return pin_for_sampler(position)


def run_bench(cfg_node: DictConfig, progress: Callable | None = None,
              on_folder: Callable[[Path], None] | None = None,
              on_iteration: Callable[[str, str, int], None] | None = None) -> Path:
    """Run the configured benchmark; returns the results folder. `progress(variant, record)`
    is called as each problem finishes, `on_iteration(variant, problem id, iterations)`
    after each of a problem's search iterations. `on_folder(path)` is called once the
    folder exists, before any model loads (the CLI sends library output to a log file
    there)."""
    cfg: Config = validate(cfg_node)
    check_context(cfg)  # before any download or model load
    if cfg.bench.mode is BenchMode.ceiling:  # times raw vLLM only: no device profile to measure
        from tts.benchmarks.ceiling import run_ceiling
        return run_ceiling(cfg_node, on_folder=on_folder)
    here = kv_budget(on_this_host(cfg_node))
    if here is not cfg_node:
        cfg_node, cfg = here, validate(here)
    model_runner(cfg)  # before the first engine: vLLM chooses its runner once per process
    problems = load_problems_for(cfg)
    if not problems:
        raise ConfigError("dataset: the subset selects no problems")
    problems, skipped = fit_prompts(cfg, problems)
    if not problems:
        raise ConfigError("dataset: no selected problem's prompt fits the engines: "
                          + "; ".join(f"{s['problem_id']}: {s['reason']}" for s in skipped[:3]))
    for s in skipped:
        log.warning("skipped %s: %s", s["problem_id"], s["reason"])
    return run_problems(cfg, cfg_node, problems, Backends(cfg), None, progress, on_folder, on_iteration,
                        measure_raw=cfg.bench.raw_generator, skipped=skipped)


def on_this_host(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `device` this machine's own profile where the configured one is a
    CPU's, for a run whose generator is vLLM here: on a CUDA host its GPU's profile, by
    name (`tts.profiling.calibrate.gpu_profile`; `device: cpu` is the default, so a GPU run
    that names no device gets its card's); on a CPU, this CPU's own calibration where the
    configured one was measured on another CPU (`host_profile`). A GPU profile given
    (`device=h100`) is kept. The run folder's config records the profile used."""
    backend = cfg_node.generator.backend
    if cfg_node.device.kind != "cpu" or getattr(backend, "value", backend) != BackendKind.vllm.value:
        return cfg_node
    import copy
    from dataclasses import asdict

    from tts.backends.vllm.engine import has_cuda
    from tts.memory.device import device_from_dict
    from tts.profiling.calibrate import gpu_profile, host_profile

    configured = device_from_dict(OmegaConf.to_container(cfg_node.device, resolve=True))
    if has_cuda():
        profile, note = gpu_profile(configured)
    else:
        profile, note = _resumed_device(cfg_node, configured) or host_profile(configured)
    if note is None:
        return cfg_node
    log.warning(note)
    cfg_node = copy.deepcopy(cfg_node)
    for key, value in asdict(profile).items():
        cfg_node.device[key] = value
    return cfg_node


def _resumed_device(cfg_node: DictConfig, configured):
    """A resumed run's own profile, with a note, when its folder recorded one measured on
    this CPU in place of `configured` (its speculation width and memory split stay those
    of its first part, and a measurement that differs by a hair does not refuse the resume
    as "other settings"); None otherwise."""
    if not (cfg_node.bench.resume and cfg_node.bench.run_name):
        return None
    from tts.memory.device import device_from_dict
    from tts.profiling.calibrate import this_host

    try:  # a corrupt config.yaml is reported when the run folder opens
        saved = RunStore(Path(cfg_node.bench.results_dir) / cfg_node.bench.run_name).saved_config().get("device")
        recorded = device_from_dict(saved) if isinstance(saved, dict) else None
    except (TypeError, ValueError):
        return None
    if recorded is None or recorded == configured or recorded.kind != "cpu" or recorded.host != this_host():
        return None
    return recorded, f"device=cpu: --resume keeps the profile its run measured on {recorded.host}"


def run_problems(cfg: Config, cfg_node: DictConfig, problems: list, backends, host: dict | None,
                 progress: Callable | None = None, on_folder: Callable[[Path], None] | None = None,
                 on_iteration: Callable[[str, str, int], None] | None = None, record_trace: bool = True,
                 measure_raw: bool = False, skipped: list[dict] | None = None) -> Path:
    """Run every variant over `problems` on `backends` (`Backends`, or a replay's), writing
    the run folder; `host` None is this machine's (`run_host`). With `measure_raw`, raw
    vLLM's generator tok/s is timed first (`bench.raw_generator`). `skipped`: the problems
    left out because their prompts do not fit (`tts.problems.fit_prompts`), written to the
    folder and counted in the summary. Returns the folder."""
    variants = run_variants(cfg)
    store = _open_store(cfg, cfg_node, [n for n, _, _ in variants])
    if on_folder:
        on_folder(store.path)
    if skipped is not None:
        store.write_skipped(skipped)
    if measure_raw and store.raw_generator() is None:  # a resumed run keeps its measurement
        store.write_raw_generator(_raw_generator(cfg, problems[0].problem))
    host = host or run_host(cfg)
    done = store.done_keys(cfg.bench.seed) if cfg.bench.resume else set()
    logger = RunLogger(cfg.logger.wandb, cfg.logger.mode, cfg.logger.project, cfg.logger.entity,
                       list(cfg.logger.tags), store.path,
                       OmegaConf.to_container(cfg_node, resolve=True), store.path.name)
    # step statistics of every variant, carried across a resume like the records
    step_logs: dict[str, dict] = store.step_logs() if cfg.bench.resume else {}
    trace = TraceRecorder(store.path / TRACE, {"generator": cfg.generator.model, "verifier": cfg.verifier.model,
                                               "adapter": cfg.verifier.adapter.value, "sampler": host.get("sampler")})
    try:
        for name, optim, search in variants:
            todo = {seed: [p for p in problems if (name, p.id, seed) not in done] for seed in cfg.bench.run_seeds}
            if any(todo.values()):
                backends.start_variant(name)
            for seed, mine in todo.items():
                if not mine:
                    continue
                # one pass per seed, each on its own engine (the seed is the engine's, and
                # each pass starts on cold caches like the first). The engine lives in this
                # call only: the next one's engines are built once nothing holds this one's
                # (Backends.get frees replaced ones)
                seeded = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, seed=seed))
                _run_variant(name, build_engine(seeded, optim, backends, search), mine, store, step_logs, logger,
                             progress, trace if record_trace else None, on_iteration, seed)
    finally:
        backends.close()
    summary, plots = write_summary(store, [n for n, _, _ in variants], step_logs, host)
    logger.log_summary(summary, {"records": _table_rows(store.records())}, plots)
    logger.finish()
    return store.path


def _raw_generator(cfg: Config, problem: str) -> dict:
    """Raw vLLM's tok/s at the run's sequences in flight, before any variant loads its
    models (`tts.benchmarks.ceiling.raw_generator`); a reason instead without vLLM."""
    if cfg.generator.backend is not BackendKind.vllm:
        reason = f"generator.backend={cfg.generator.backend.value}: raw vLLM needs a vLLM generator"
        log.warning("bench.raw_generator: skipped (%s)", reason)
        return {"skipped": reason}
    from tts.benchmarks.ceiling import raw_generator

    return raw_generator(cfg, problem)


def _open_store(cfg: Config, cfg_node: DictConfig, names: list[str]) -> RunStore:
    """The run's folder (new, or the one `--resume` continues, refused when it was run with
    other settings), with its config written."""
    hint = f"{cfg.search.algorithm.value}-n{cfg.search.n}-" + "-vs-".join(names)
    store = RunStore.create(cfg.bench.results_dir, cfg.bench.run_name, cfg.bench.resume, hint)
    if cfg.bench.resume:  # records made with other settings must not be mixed in
        changed = store.config_changes(OmegaConf.to_container(cfg_node, resolve=True))
        if changed:
            raise ConfigError(f"--resume: {store.path} was run with other settings ({'; '.join(changed)}); "
                              "resume with the same ones, or choose another bench.run_name")
    store.write_config(to_yaml(cfg_node))
    return store


def _run_variant(name: str, engine, todo: list, store: RunStore, step_logs: dict[str, dict],
                 logger: RunLogger, progress: Callable | None, trace: TraceRecorder | None,
                 on_iteration: Callable[[str, str, int], None] | None = None, seed: int = 0) -> None:
    """Run one variant's remaining problems under one seed (the engine's): a record (with
    its `seed`), the step statistics and the trace written as each problem finishes, so a
    killed run keeps them. The variant's wall clock and step statistics run on across its
    seeds' passes."""
    if on_iteration:
        engine.on_problem_iteration = functools.partial(on_iteration, name)
    gold = {p.id: p for p in todo}
    # the variant's wall clock, carried across a resume by the records themselves
    start = clock.now() - variant_wall(store.records(), name)
    earlier = step_logs.get(name)  # the part of this variant a killed process ran
    # each vLLM engine's block pool: evictions and blocks recomputed after one (thrash)
    counters = attach_counters(generator=engine.gen, verifier=engine.verifier)
    if counters:
        engine.log_sources[KV_BLOCKS] = lambda: {model: c.counts() for model, c in counters.items()}
    detach_trace = trace.attach(name, engine.gen, engine.verifier) if trace else None
    try:
        for outcome in engine.run([ProblemInput(p.id, p.problem) for p in todo]):
            p = gold[outcome.problem.id]
            record = build_record(outcome, p.answer, name, {"seed": seed, "level": p.level, "subject": p.subject})
            record["variant_wall_s"] = clock.now() - start
            store.append(record)
            step_logs[name] = merge_step_logs(earlier, engine.step_logs())
            store.write_step_logs(step_logs)
            if trace:
                trace.flush()
            logger.log_problem(record)
            if progress:
                progress(name, record)
    finally:
        detach_counters(counters)
        if trace:
            detach_trace()
            trace.flush()


def _table_rows(records: list[dict]) -> list[dict]:
    return [{"variant": r["variant"], "problem_id": r["problem_id"], "seed": r.get("seed"), "gold": r["gold"],
             "majority": r["answers"].get("majority"), "correct_majority": r["correct"].get("majority"),
             "latency_s": r["metrics"]["latency_s"], "precise_goodput": r["metrics"]["precise_goodput"]}
            for r in records]

