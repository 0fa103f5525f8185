"""The bench loop (`run_problems`): every variant over every round of problems, in its turn,
under each seed of `bench.seeds` (default `[bench.seed]`), each pass on its own engine.
A record carries its seed, so records and a resume are keyed by (variant, problem, seed).
The run folder holds the config, the records, the step statistics, the trace and the
summary, written as the run goes (`tts.results.store`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tts.assembly.build import build_engine
from tts.bench.host import run_host
from tts.assembly.variants import run_variants
from tts.bench.record import run_variant
from tts.bench.rounds import Interim, chunks_left, in_turn, rounds
from tts.config.compose import ConfigError, to_yaml
from tts.config.schema import Config
from tts.engine.problem import ProblemInput
from tts.results.records import build_record
from tts.results.store import RunStore
from tts.results.summary import write_summary
from tts.search import policy_named
from tts.wandb_sink import RunLogger
from tts.trace.provenance import recorded
from tts.trace.recorder import TraceRecorder

log = logging.getLogger(__name__)


def run_problems(cfg: Config, cfg_node: DictConfig, problems: list, backends, host: dict | None,
                 progress: Callable | None = None, on_folder: Callable[[Path], None] | None = None,
                 on_iteration: Callable[[str, str, int], None] | None = None, record_trace: bool = True,
                 raw_generator: Callable[[], dict] | None = None, skipped: list[dict] | None = None,
                 on_plan: Callable[[dict[str, tuple[int, int]]], None] | None = None,
                 warmup: int = 0) -> Path:
    """Run every variant over `problems` on `backends` (`Backends`, or a replay's), writing
    the run folder; `host` None is this machine's (`run_host`). `raw_generator()`, where
    given, times raw vLLM's generator first (`bench.raw_generator`). `skipped`: the problems
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
    if raw_generator and store.raw_generator() is None:  # a resumed run keeps its measurement
        store.write_raw_generator(raw_generator())
    host = host or run_host(cfg)
    logger = RunLogger.from_config(OmegaConf.to_container(cfg_node, resolve=True), store.path)
    # step statistics of every variant, carried across a resume like the records
    step_logs: dict[str, dict] = store.step_logs() if cfg.bench.resume else {}
    trace = TraceRecorder(store.trace, {"generator": cfg.generator.model, "verifier": cfg.verifier.model,
                                        "adapter": cfg.verifier.adapter.value, "sampler": host.get("sampler"),
                                        "record_for": recorded_for(cfg)},
                          recorded(cfg, variants) if record_trace else None)  # the code and options
    names = [n for n, _, _ in variants]
    interim = Interim(store, step_logs, host, every_round=cfg.bench.chunk > 0)
    run_one = functools.partial(run_variant, store=store, step_logs=step_logs, logger=logger, progress=progress,
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


WARM_UP_ITERATIONS = 2  # the first search iterations: every step shape a run starts with


def _warm_up(cfg: Config, variant: tuple, backends, problems: list) -> None:
    """Run `problems` once on `variant`'s engines, for their first `WARM_UP_ITERATIONS`
    search iterations, and forget them: nothing is recorded, traced or timed. The engines
    are kept (`Backends`), so the first timed problem finds the kernels and buffers a first
    run builds, as every later one does. The cut keeps a warm-up short at any n: a whole
    problem at n=512 on a CPU would take as long as the timed one. Each outcome is also
    graded into a record that is thrown away: the first timed record then finds the grading
    pool started and its libraries loaded (scipy's statistics took 2 s to import, inside
    the first problem's wall time)."""
    name, optim, search = variant
    search = search or cfg.search
    search = dataclasses.replace(search, max_iterations=min(search.max_iterations, WARM_UP_ITERATIONS))
    log.info("warm-up: %s on %d problem(s), %d iterations, not recorded", name, len(problems),
             search.max_iterations)
    backends.start_variant(name)
    gold = {p.id: p.answer for p in problems}
    for outcome in build_engine(cfg, optim, backends, search).run([ProblemInput(p.id, p.problem) for p in problems]):
        build_record(outcome, gold[outcome.problem.id], name)


def recorded_for(cfg: Config) -> dict | None:
    """The card and pair the run's decisions are priced for (`bench.record_for`), as its
    trace's header says it: the config choices, and the models they name; None: none."""
    if cfg.bench.record_for.device is None:
        return None
    from tts.assembly.card import card_config

    card = card_config(cfg)
    return {**dataclasses.asdict(cfg.bench.record_for),
            "models": {"generator": card.generator.model, "verifier": card.verifier.model}}


def _open_store(cfg: Config, cfg_node: DictConfig, names: list[str]) -> RunStore:
    """The run's folder (new, or the one `--resume` continues, refused when it was run with
    other settings), with its config written."""
    hint = f"{policy_named(cfg.search.algorithm).name}-n{cfg.search.n}-"  # a plain name, no module:attribute
    hint += "-vs-".join(names)
    store = RunStore.create(cfg.bench.results_dir, cfg.bench.run_name, cfg.bench.resume, hint)
    if cfg.bench.resume:  # records made with other settings must not be mixed in
        changed = store.config_changes(OmegaConf.to_container(cfg_node, resolve=True))
        if changed:
            raise ConfigError(f"--resume: {store.path} was run with other settings ({'; '.join(changed)}); "
                              "resume with the same ones, or choose another bench.run_name")
    store.write_config(to_yaml(cfg_node))
    return store


def _table_rows(records: list[dict]) -> list[dict]:
    return [{"variant": r["variant"], "problem_id": r["problem_id"], "seed": r.get("seed"), "gold": r["gold"],
             "majority": r["answers"].get("majority"), "correct_majority": r["correct"].get("majority"),
             "latency_s": r["metrics"]["latency_s"], "precise_goodput": r["metrics"]["precise_goodput"]}
            for r in records]
