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
from tts.assembly.build import build_engine
from tts.assembly.host import model_runner, on_this_host, run_host
from tts.assembly.variants import run_variants
from tts.backends.factory import Backends
from tts.backends.vllm.thrash import attach_counters, detach_counters
from tts.config.compose import ConfigError, to_yaml, validate
from tts.config.limits import check_context
from tts.config.schema import BackendKind, BenchMode, Config
from tts.engine.engine import ProblemInput
from tts.kv_budget import kv_budget
from tts.metrics.measures import KV_BLOCKS, merge_step_logs
from tts.problems import fit_prompts, load_problems_for
from tts.replay.trace import TRACE, TraceRecorder
from tts.results.records import build_record
from tts.results.store import RunStore
from tts.results.summary import variant_wall, write_summary
from tts.results.wandb_logger import RunLogger

log = logging.getLogger(__name__)


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
    names = [n for n, _, _ in variants]
    chunks = chunked(problems, cfg.bench.chunk)
    try:
        for c, part in enumerate(chunks):
            for i, (name, optim, search) in enumerate(variants):
                todo = {seed: [p for p in part if (name, p.id, seed) not in done] for seed in cfg.bench.run_seeds}
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
                    _run_variant(name, build_engine(seeded, optim, backends, search), mine, store, step_logs,
                                 logger, progress, trace if record_trace else None, on_iteration, seed, host)
                # as each variant of the first chunk ends (its problems are the run's so far),
                # then as each later chunk ends: a table compares like numbers of problems.
                # The run's last variant is left to the summary below
                last, final = i + 1 == len(names), i + 1 == len(names) and c + 1 == len(chunks)
                if any(todo.values()) and (c == 0 or last) and not final:
                    _interim_summary(store, names[:i + 1], step_logs, host, names[i + 1:] + chunks_left(chunks, c))
    finally:
        backends.close()
    summary, plots = write_summary(store, names, step_logs, host, pending=[])
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


def chunked(problems: list, size: int) -> list[list]:
    """`problems` in chunks of `size` (`bench.chunk`; 0: one chunk), in their order."""
    return [problems[i:i + size] for i in range(0, len(problems), size)] if size else [problems]


def chunks_left(chunks: list[list], c: int) -> list[str]:
    """The chunks after chunk `c` (numbered from 0), in words; none when it is the last."""
    left = chunks[c + 1:]
    if not left:
        return []
    which = f"chunk {c + 2}" if len(left) == 1 else f"chunks {c + 2}-{len(chunks)}"
    return [f"{which} of {len(chunks)} ({sum(map(len, left))} problems)"]


def _interim_summary(store: RunStore, names: list[str], step_logs: dict[str, dict], host: dict,
                     pending: list[str]) -> None:
    """The summary of the variants run so far, written as each one ends, so a run that takes
    many sessions of `--resume` (or is killed) keeps its finished variants' tables; it names
    the variants (and `bench.chunk`'s chunks) still to run, and leaves the plots to the
    run's last summary. A failure here is logged, not raised: the run goes on, and its last
    summary raises it."""
    try:
        write_summary(store, names, step_logs, host, pending=pending, plots=False)
    except Exception as err:  # noqa: BLE001 (the run's records matter more than an interim table)
        log.warning("interim summary after %s not written: %s", names[-1], err)


def _run_variant(name: str, engine, todo: list, store: RunStore, step_logs: dict[str, dict],
                 logger: RunLogger, progress: Callable | None, trace: TraceRecorder | None,
                 on_iteration: Callable[[str, str, int], None] | None = None, seed: int = 0,
                 host: dict | None = None) -> None:
    """Run one variant's remaining problems under one seed (the engine's): a record (with
    its `seed`), the step statistics and the trace written as each problem finishes, so a
    killed run keeps them. The variant's wall clock and step statistics run on across its
    seeds' passes (and `bench.chunk`'s chunks). `host`: what each record says it ran on."""
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
            record = build_record(outcome, p.answer, name,
                                  {"seed": seed, "level": p.level, "subject": p.subject, "host": host})
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

