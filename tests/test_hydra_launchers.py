"""`tts bench -m` through Hydra's own multirun: its launchers run the jobs (tts.hydra_app)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tts.models.cache import is_present

TTS = str(Path(sys.executable).with_name("tts"))
FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=1", "--config-name=config"]


def sweep(tmp_path: Path, *args: str, command: str = "bench", marker: str = "summary.json") -> tuple[list[Path], int]:
    """Run `tts COMMAND -m ARGS` in `tmp_path`; return its job folders and the `tts` process's pid."""
    with subprocess.Popen([TTS, command, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=tmp_path, env={**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}) as tts:
        out, err = tts.communicate(timeout=900)
    assert tts.returncode == 0, out[-2000:] + err[-3000:]
    assert "sweep: results/" in out
    return sorted(p.parent for p in tmp_path.glob(f"results/*-sweep/*/{marker}")), tts.pid


RAY_MISSING = [m for m in ("ray", "hydra_plugins.hydra_ray_launcher") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="hydra-joblib-launcher is not installed (pip install 'tts[joblib]')")
def test_joblib_launcher_runs_the_jobs_in_worker_processes(tmp_path: Path) -> None:
    # n_jobs=2: joblib's default (one job per CPU) runs the jobs in the launching process on one CPU
    jobs, tts_pid = sweep(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "search.n=4,8", *FAKE)
    assert [j.name for j in jobs] == ["0", "1"]
    meta = [json.loads((j / "job.json").read_text()) for j in jobs]
    assert [m["overrides"][0] for m in meta] == ["search.n=4", "search.n=8"]
    assert all(m["pid"] != tts_pid for m in meta)  # in joblib's worker processes
    ns = [json.loads((j / "summary.json").read_text())["variants"]["baseline"] for j in jobs]
    assert [len(json.loads((j / "records.jsonl").read_text().splitlines()[0])["candidates"]) for j in jobs] == [4, 8]
    assert all(n["num_problems"] == 1 for n in ns)
    # the sweep folder's summary across jobs, and a report of the sweep folder compares them
    from tts.report import write_report

    sweep_dir = jobs[0].parent
    across = json.loads((sweep_dir / "sweep.json").read_text())
    assert [j["folder"] for j in across["jobs"]] == ["0", "1"] and across["jobs"][1]["overrides"][0] == "search.n=8"
    report = json.loads((write_report([str(sweep_dir)], out=tmp_path / "r").parent / "report.json").read_text())
    assert len(report["runs"]) == 2 and report["host_warnings"] == []


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="hydra-joblib-launcher is not installed (pip install 'tts[joblib]')")
def test_profile_memory_sweeps_through_the_launcher_too(tmp_path: Path) -> None:
    """`tts profile-memory -m hydra/launcher=joblib`: one profile per job, in its job folder,
    and `tts report` of the sweep folder reads every job's profile."""
    jobs, _ = sweep(tmp_path, "hydra/launcher=joblib", "search.n=2,4", "search.beam_width=2", "profile.num_problems=1",
                    "profile.splits=[0.3,0.6]", "profile.tight_split=0.3", "profile.loose_split=0.6", *FAKE,
                    command="profile-memory", marker="profile.json")
    assert [j.name for j in jobs] == ["0", "1"]
    assert [json.loads((j / "job.json").read_text())["overrides"][0] for j in jobs] == ["search.n=2", "search.n=4"]
    from tts.report import write_report

    report = json.loads((write_report([str(jobs[0].parent)], out=tmp_path / "r").parent / "report.json").read_text())
    assert len(report["runs"]) == 2


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                    reason="hydra-submitit-launcher is not installed (pip install 'tts[slurm]')")
@pytest.mark.skipif(not is_present("smollm2-135m-instruct"), reason="default model not pulled")
def test_submitit_local_runs_a_real_vllm_job(tmp_path: Path) -> None:
    """submitit_local is the code path SLURM uses (submitit_slurm), on this machine."""
    jobs, tts_pid = sweep(tmp_path, "hydra/launcher=submitit_local", "--config-name=config", "logger=none",
                          "search.n=2", "search.beam_width=2", "search.max_iterations=2", "generator.step_max_tokens=12",
                          "generator.max_total_tokens=36", "dataset.first_k=1", "search.aggregation=last")
    assert len(jobs) == 1
    summary = json.loads((jobs[0] / "summary.json").read_text())
    assert summary["host"]["dtype"]["generator"] in ("bfloat16", "float32")
    assert summary["variants"]["baseline"]["num_problems"] == 1
    assert json.loads((jobs[0] / "job.json").read_text())["pid"] not in (tts_pid, os.getpid())


@pytest.mark.skipif(bool(RAY_MISSING), reason=f"{' and '.join(RAY_MISSING)} not installed "
                                               "(TTS_EXTRAS=ray bash cli/install.sh)")
def test_the_ray_launcher_runs_the_jobs_on_a_local_cluster(tmp_path: Path) -> None:
    """`hydra/launcher=ray` without an address starts a Ray cluster of its own on this machine
    and runs each job as a Ray task, in a Ray worker process."""
    jobs, tts_pid = sweep(tmp_path, "hydra/launcher=ray", "search.n=2,4", "search.beam_width=2", *FAKE)
    assert [j.name for j in jobs] == ["0", "1"]
    meta = [json.loads((j / "job.json").read_text()) for j in jobs]
    assert [m["overrides"][0] for m in meta] == ["search.n=2", "search.n=4"]
    assert all(m["pid"] != tts_pid for m in meta)  # in Ray's worker processes
    assert [len(json.loads((j / "records.jsonl").read_text().splitlines()[0])["candidates"]) for j in jobs] == [2, 4]
    across = json.loads((jobs[0].parent / "sweep.json").read_text())
    assert [j["folder"] for j in across["jobs"]] == ["0", "1"]


def test_the_ray_launcher_joins_a_running_cluster_without_sizing_its_object_store():
    from tts.hydra_app import ray_overrides

    joining = ["hydra/launcher=ray", "hydra.launcher.ray.init.address=auto", "search.n=4,8"]
    assert ray_overrides(joining) == [*joining, "+hydra.launcher.ray.init.object_store_memory=null"]
    for alone in (["hydra/launcher=ray", "search.n=4,8"],  # the launcher starts its own cluster
                  ["hydra/launcher=ray", "hydra.launcher.ray.init.address=null"],
                  [*joining, "+hydra.launcher.ray.init.object_store_memory=1000000000"],
                  ["hydra/launcher=joblib", "hydra.launcher.ray.init.address=auto"]):
        assert ray_overrides(alone) == alone
