"""`tts bench`: run one or more engine variants over a problem set and record everything.

Variants (`bench.compare`, else the configured `optim`) take turns in this process, over
the same problems with the same seeds, sharing the loaded models: round by round
(`rounds`), in the listed order and then reversed (`in_turn`, `bench.order`), so that a
machine's drift over a long run does not land on the later variants. Each
problem runs once per seed of `bench.seeds` (default `[bench.seed]`); a record carries its
seed, so records and a resume are keyed by (variant, problem, seed).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
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
from tts.config.schema import BackendKind, BenchMode, Config, VariantOrder
from tts.engine.engine import ProblemInput
from tts.kv_budget import kv_budget
from tts.metrics.measures import KV_BLOCKS, merge_step_logs
from tts.problems import fit_prompts, load_problems_for
from tts.results.records import build_record
from tts.results.store import RunStore
from tts.results.summary import variant_wall, write_summary
from tts.results.wandb_logger import RunLogger
from tts.trace.format import TRACE
from tts.trace.provenance import recorded
from tts.trace.recorder import TraceRecorder

log = logging.getLogger(__name__)


def run_bench(cfg_node: DictConfig, progress: Callable | None = None,
              on_folder: Callable[[Path], None] | None = None,
              on_iteration: Callable[[str, str, int], None] | None = None,
              on_plan: Callable[[dict[str, tuple[int, int]]], None] | None = None) -> Path:
    """Run the configured benchmark; returns the results folder. `progress(variant, record)`
    is called as each problem finishes, `on_iteration(variant, problem id, iterations)`
    after each of a problem's search iterations. `on_folder(path)` is called once the
    folder exists, before any model loads (the CLI sends library output to a log file
    there); `on_plan({variant: (runs, done)})` once the problems that will run are known
    (those whose prompts fit, times the seeds; `done`: those a resume keeps), before any
    engine starts (the CLI draws its progress bars then)."""
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
                        measure_raw=cfg.bench.raw_generator, skipped=skipped, on_plan=on_plan,
                        warmup=cfg.bench.warmup)


def run_problems(cfg: Config, cfg_node: DictConfig, problems: list, backends, host: dict | None,
                 progress: Callable | None = None, on_folder: Callable[[Path], None] | None = None,
                 on_iteration: Callable[[str, str, int], None] | None = None, record_trace: bool = True,
                 measure_raw: bool = False, skipped: list[dict] | None = None,
                 on_plan: Callable[[dict[str, tuple[int, int]]], None] | None = None,
                 warmup: int = 0) -> Path:
    """Run every variant over `problems` on `backends` (`Backends`, or a replay's), writing
    the run folder; `host` None is this machine's (`run_host`). With `measure_raw`, raw
    vLLM's generator tok/s is timed first (`bench.raw_generator`). `skipped`: the problems
    left out because their prompts do not fit (`tts.problems.fit_prompts`), written to the
    folder and counted in the summary. `warmup`: problems the first variant runs once,
    unrecorded, before the first round (`bench.warmup`; a replay's simulated clock needs
    none). Returns the folder."""
    variants = run_variants(cfg)
    store = _open_store(cfg, cfg_node, [n for n, _, _ in variants])
    if on_folder:
        on_folder(store.path)
    if skipped is not None:
        store.write_skipped(skipped)
    done = store.done_keys(cfg.bench.seed) if cfg.bench.resume else set()
    if on_plan:
        runs = [(p.id, seed) for p in problems for seed in cfg.bench.run_seeds]
        on_plan({name: (len(runs), sum((name, *run) in done for run in runs)) for name, _, _ in variants})
    if measure_raw and store.raw_generator() is None:  # a resumed run keeps its measurement
        store.write_raw_generator(_raw_generator(cfg, problems[0].problem))
    host = host or run_host(cfg)
    logger = RunLogger.from_config(OmegaConf.to_container(cfg_node, resolve=True), store.path)
    # step statistics of every variant, carried across a resume like the records
    step_logs: dict[str, dict] = store.step_logs() if cfg.bench.resume else {}
    trace = TraceRecorder(store.path / TRACE, {"generator": cfg.generator.model, "verifier": cfg.verifier.model,
                                               "adapter": cfg.verifier.adapter.value, "sampler": host.get("sampler")},
                          recorded(cfg, variants) if record_trace else None)  # the code and options
    names = [n for n, _, _ in variants]
    interim = Interim(store, step_logs, host, every_round=cfg.bench.chunk > 0)
    run_one = functools.partial(_run_variant, store=store, step_logs=step_logs, logger=logger, progress=progress,
                                trace=trace if record_trace else None, on_iteration=on_iteration, host=host)
    try:
        if warmup and any((n, p.id, seed) not in done for n in names for p in problems for seed in cfg.bench.run_seeds):
            _warm_up(cfg, variants[0], backends, problems[:warmup])
        _run_rounds(cfg, variants, rounds(problems, cfg.bench), done, backends, run_one, interim)
    finally:
        backends.close()
    summary, plots = write_summary(store, names, step_logs, host, pending=[])
    logger.log_summary(summary, {"records": _table_rows(store.records())}, plots)
    logger.finish()
    return store.path


def _run_rounds(cfg: Config, variants: list, chunks: list[list], done: set, backends, run_one: Callable,
                interim: Interim) -> None:
    """Every variant over each round's problems (`rounds`), in its turn (`in_turn`), skipping
    what `done` holds; `run_one(name, engine, problems, seed=...)` runs and records one
    pass. Interim summaries as each variant of the first round ends, then as later rounds end:
    a table compares like numbers of problems (the run's last round is left to its summary)."""
    names = [n for n, _, _ in variants]
    for c, part in enumerate(chunks):
        turn = in_turn(variants, c, cfg.bench.order)
        for i, (name, optim, search) in enumerate(turn):
            todo = {seed: [p for p in part if (name, p.id, seed) not in done] for seed in cfg.bench.run_seeds}
            if any(todo.values()):
                backends.start_variant(name)
            for seed, mine in todo.items():
                if not mine:
                    continue
                # one pass per seed, each on its own engine (the seed is the engine's, and each
                # pass starts on cold caches like the first). The engine lives in this call
                # only: the next one's engines are built once nothing holds this one's
                # (Backends.get frees replaced ones)
                seeded = dataclasses.replace(cfg, bench=dataclasses.replace(cfg.bench, seed=seed))
                run_one(name, build_engine(seeded, optim, backends, search), mine, seed=seed)
            if any(todo.values()) and c + 1 < len(chunks) and (c == 0 or i + 1 == len(turn)):
                ran = names if c else [n for n, _, _ in turn[:i + 1]]
                left = chunks_left(chunks, c, "chunk" if cfg.bench.chunk else "round")
                interim.write(ran, [n for n, _, _ in turn[i + 1:]] * (c == 0) + left, first_round=c == 0)


def _warm_up(cfg: Config, variant: tuple, backends, problems: list) -> None:
    """Run `problems` once on `variant`'s engines and forget them: nothing is recorded,
    traced or timed. The engines are kept (`Backends`), so the first timed problem finds
    the kernels and buffers a first run builds, as every later one does."""
    name, optim, search = variant
    log.info("warm-up: %s on %d problem(s), not recorded", name, len(problems))
    backends.start_variant(name)
    for _ in build_engine(cfg, optim, backends, search).run([ProblemInput(p.id, p.problem) for p in problems]):
        pass


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


def rounds(problems: list, bench) -> list[list]:
    """The run's rounds: every variant runs a round's problems before the next round starts.
    A round is a chunk (`bench.chunk`); without chunks, the variants interleave one problem
    at a time at concurrency 1 (a problem starts on cold caches then, so its record is the
    same whichever variant ran before), and take the whole selection as one round with
    problems in flight together (rounds that short would be all ramp and tail: set
    `bench.chunk` to interleave a throughput run)."""
    if bench.chunk:
        return chunked(problems, bench.chunk)
    if bench.order is VariantOrder.interleaved and bench.concurrency == 1:
        return chunked(problems, 1)
    return [problems]


def in_turn(variants: list, r: int, order: VariantOrder) -> list:
    """The variants in the order they run in round `r`: as listed, and with `interleaved`
    reversed in every odd round (A B C, C B A, A B C ...). Over two rounds each variant's
    mean position is the same, so a drift of the machine's speed that is linear over them
    weighs on every variant alike; and a variant runs twice in a row at each turn, which
    spares an engine rebuild where two variants' engines differ."""
    return variants[::-1] if order is VariantOrder.interleaved and r % 2 else list(variants)


def chunks_left(chunks: list[list], c: int, noun: str = "chunk") -> list[str]:
    """The chunks (or rounds) after the `c`-th (numbered from 0), in words; none when it is
    the last."""
    left = chunks[c + 1:]
    if not left:
        return []
    which = f"{noun} {c + 2}" if len(left) == 1 else f"{noun}s {c + 2}-{len(chunks)}"
    return [f"{which} of {len(chunks)} ({sum(map(len, left))} problems)"]


class Interim:
    """The summaries written while a run goes on (`_interim_summary`): after every variant of
    the first round, then at a round's end, each chunk's (`every_round`) or, with rounds of
    one problem, at most once a minute of real time (a summary's intervals take a second or
    two; a run of many short rounds would spend its time on them)."""

    EVERY_S = 60.0

    def __init__(self, store: RunStore, step_logs: dict[str, dict], host: dict, every_round: bool) -> None:
        self.store, self.step_logs, self.host, self.every_round = store, step_logs, host, every_round
        self.last = time.monotonic()

    def write(self, names: list[str], pending: list[str], first_round: bool = False) -> None:
        now = time.monotonic()
        if first_round or self.every_round or now - self.last >= self.EVERY_S:
            _interim_summary(self.store, names, self.step_logs, self.host, pending)
            self.last = time.monotonic()


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


def _run_variant(name: str, engine, todo: list, *, store: RunStore, step_logs: dict[str, dict],
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

