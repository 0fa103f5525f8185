"""`tts bench`: run one or more engine variants over a problem set and record everything.

The verb's pre-flight (the context lengths, the ceiling mode, this host's KV budget and
vLLM model runner), the problems whose prompts fit, and raw vLLM's generator rate; then the
bench loop (`tts.bench.loop.run_problems`: the variants in turn over rounds and seeds, the
run folder and its resume, the records, the summaries and W&B).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from tts.backends.factory import Backends, overlaps
from tts.bench.host import model_runner
from tts.bench.loop import run_problems
from tts.config.compose import ConfigError, validate
from tts.config.limits import check_context
from tts.config.enums import BackendKind, BenchMode
from tts.config.schema import Config
from tts.kv_budget import kv_budget, kv_for_the_card
from tts.problems import fit_prompts, load_problems_for
from tts.profiling.host_device import on_this_host

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
    overlaps(cfg)  # `overlap=on` where vLLM cannot run it: one line, before any model loads
    if cfg.bench.mode is BenchMode.ceiling:  # times raw vLLM only: no device profile to measure
        from tts.benchmarks.ceiling import run_ceiling
        return run_ceiling(cfg_node, on_folder=on_folder)
    here = kv_for_the_card(kv_budget(on_this_host(cfg_node)))  # a card's, where the run is recorded for one
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
    raw = functools.partial(_raw_generator, cfg, problems[0].problem) if cfg.bench.raw_generator else None
    return run_problems(cfg, cfg_node, problems, Backends(cfg), None, progress, on_folder, on_iteration,
                        raw_generator=raw, skipped=skipped, on_plan=on_plan, warmup=cfg.bench.warmup)


def _raw_generator(cfg: Config, problem: str) -> dict:
    """Raw vLLM's tok/s at the run's sequences in flight, before any variant loads its
    models (`tts.benchmarks.ceiling.raw_generator`); a reason instead without vLLM."""
    if cfg.generator.backend is not BackendKind.vllm:
        reason = f"generator.backend={cfg.generator.backend.value}: raw vLLM needs a vLLM generator"
        log.warning("bench.raw_generator: skipped (%s)", reason)
        return {"skipped": reason}
    from tts.benchmarks.ceiling import raw_generator

    return raw_generator(cfg, problem)
