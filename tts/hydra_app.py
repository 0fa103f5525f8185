"""`tts bench -m` (and `tts eval -m`, `tts profile-memory -m`) through Hydra's own
multirun, so Hydra's launchers and sweepers work.

The plain `-m` sweep (`tts.cli_support.compose_jobs`) runs its jobs one after another in
this process. With a `hydra/launcher=...` or `hydra/sweeper=...` override, the Typer
command hands its argument list to a Hydra application instead (`run_hydra_multirun`):
Hydra's sweeper expands the sweep and its launcher runs the jobs, e.g.

- `hydra/launcher=joblib` (`pip install 'tts[joblib]'`): local parallel processes;
- `hydra/launcher=submitit_slurm` / `submitit_local` (`tts[slurm]`): SLURM jobs, or the
  same code path on this machine;
- `hydra/launcher=ray` (`tts[ray]`): a Ray cluster;
- `hydra/sweeper=optuna` (`hydra-optuna-sweeper`): search a space instead of gridding it.

Each job composes its config exactly as `tts bench` does (`tts.config.compose.compose`,
with the job's own overrides) and writes its results folder into Hydra's job folder
`<sweep>/<job number>/`, and `job.json` there when it ends (its overrides, host and pid).
A user's own rule or search algorithm (`module:attribute`, `tts.config.plugins`) is
imported in the job's process by the same value, from the folder the sweep was started in
(Hydra's `hydra.runtime.cwd`, first on the worker's `sys.path`), wherever the launcher
runs the job and whatever its working folder there.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from tts.config.compose import CONF_DIR


def uses_hydra_plugins(overrides: list[str]) -> bool:
    """Whether the overrides choose a Hydra launcher or sweeper (then Hydra runs the sweep)."""
    return any(o.lstrip("+~").startswith(("hydra/launcher=", "hydra/sweeper=")) for o in overrides)


def ray_overrides(overrides: list[str]) -> list[str]:
    """The overrides, with `ray.init`'s object store size left unset when the Ray launcher
    joins a running cluster (`hydra.launcher.ray.init.address=auto`, or HOST:PORT): the
    launcher sets 75 MB for the cluster it would start itself, and `ray.init` refuses any
    size when it connects to one that runs (`ray start --head`)."""
    joins = any(o.startswith("hydra.launcher.ray.init.address=") and not o.endswith(("=null", "="))
                for o in overrides)
    sized = any("hydra.launcher.ray.init.object_store_memory" in o for o in overrides)
    if "hydra/launcher=ray" in overrides and joins and not sized:
        return [*overrides, "+hydra.launcher.ray.init.object_store_memory=null"]
    return overrides


def run_hydra_multirun(config_name: str, overrides: list[str], results_dir: str = "results",
                       task: str = "bench") -> Path:
    """Run the sweep with Hydra's multirun; returns the sweep folder. `task`: "bench" (each
    job runs `tts bench`, or `tts eval`, whose config it composes) or "profile" (each job
    runs `tts profile-memory`)."""
    import hydra

    from tts.config.schema import register_configs

    register_configs()
    sweep = Path(results_dir) / time.strftime("%Y%m%d-%H%M%S-sweep")
    argv = [sys.argv[0], "--multirun", *ray_overrides(overrides), f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=${hydra.job.num}",
            "hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    job = {"bench": run_job, "profile": run_profile_job}[task]
    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(job)
    saved, full_error = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = argv
    os.environ["HYDRA_FULL_ERROR"] = "1"  # a job's error reaches the verb's wrapper (one line for a
    try:                                 # user's mistake), not Hydra's printed traceback and exit 1
        app()
    finally:
        sys.argv = saved
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = full_error
    return sweep


def run_job(_: DictConfig) -> str:
    """One job of a Hydra multirun: compose as `tts bench` does and run it in the job folder."""
    from tts.runner import run_bench

    return _in_job_folder(run_bench)


def run_profile_job(_: DictConfig) -> str:
    """One job of a `tts profile-memory` multirun, in the job folder."""
    from rich.console import Console

    from tts.profiling.verb import profile_memory

    return _in_job_folder(lambda cfg: profile_memory(cfg, console=Console()))


def _in_job_folder(run) -> str:
    """Compose the job's config (its own overrides), point its results folder at Hydra's job
    folder, run it, and leave `job.json` there."""
    from hydra.core.hydra_config import HydraConfig

    from tts.backends.factory import models_on_cuda
    from tts.config.compose import compose
    from tts.config.plugins import on_path
    from tts.results.store import JOB

    hc = HydraConfig.get()
    on_path(hc.runtime.cwd)  # a user's module:attribute imports as in the launching process
    folder = Path(hc.runtime.output_dir)
    mine = [o for o in hc.overrides.task if not o.lstrip("+~").startswith("hydra")]
    cfg = compose(hc.job.config_name, mine + [f"bench.results_dir='{folder.parent}'", f"bench.run_name='{folder.name}'"],
                  on_gpu=models_on_cuda)  # the memory settings of the host the job runs on
    path = Path(run(cfg))
    (path / JOB).write_text(json.dumps({"overrides": mine, "job": hc.job.num, "pid": os.getpid(),
                                               "host": socket.gethostname()}, indent=2))
    return str(path)
