"""What `tts bench` prints, for real (vLLM on CPU, the default model, a tiny run): the
host line, progress, the table and the paths; vLLM's, torch's and W&B's own output goes to
the run's tts.log, and `-v` shows it instead."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tts.models.cache import is_present

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                                 reason="default model not pulled (tts models pull smollm2-135m-instruct)")]

TINY = ["logger=none", "bench.warmup=0", "search.n=2", "search.beam_width=2", "search.max_iterations=2", "generator.step_max_tokens=12",
        "generator.max_total_tokens=36", "dataset.first_k=1"]
LIBRARY_LINE = re.compile(r"\b(INFO|WARNING)\b|MainProcess|Loading safetensors|NUMA binding|wandb:")


def tts(tmp_path: Path, name: str, *extra: str) -> tuple[str, Path]:
    tool = Path(sys.executable).with_name("tts")
    done = subprocess.run([str(tool), "bench", *TINY, f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr, tmp_path / name


def test_bench_prints_what_it_ran_and_logs_the_libraries(tmp_path: Path) -> None:
    out, folder = tts(tmp_path, "quiet")
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and not [line for line in lines if LIBRARY_LINE.search(line)], out
    assert lines[0].startswith("host: ") or any(line.startswith("host: ") for line in lines[:3])
    # the main job's headline: what ran, accuracy, PMS/baseline with intervals, the tree and
    # verifier lines, where the full tables are; at most about 15 lines after the progress bars
    after = lines[next(i for i, line in enumerate(lines) if line.startswith("host: ")):]
    # the headline: at most 14 lines (the host line wrapped as the CPU's name needs), then
    # where the results, plots and log are (stderr's lines, the progress bars among them,
    # come after them in the captured output)
    after = after[:max(i for i, line in enumerate(after) if line.startswith(("results:", "plots:", "log "))) + 1]
    paths = [line for line in after if line.startswith(("results:", "plots:", "log "))]
    assert len(after) - len(paths) <= 14 and len(paths) <= 3, out
    assert any(line.startswith("ran: baseline, PMS on 1 problems") for line in after)
    assert any(line.startswith("PMS/baseline (1 pair): goodput ↑ ") for line in after)
    assert "| metric | baseline | PMS | PMS/baseline |" not in out  # the full table is in summary.md
    assert "| metric | baseline | PMS | PMS/baseline |" in (folder / "summary.md").read_text()
    assert f"results: {folder}" in out and f"{folder / 'tts.log'}" in out
    log = (folder / "tts.log").read_text()
    assert "INFO" in log and "vllm" in log.lower()


def test_verbose_shows_the_libraries(tmp_path: Path) -> None:
    out, folder = tts(tmp_path, "loud", "-v", "bench.compare=[baseline,P]")  # P: no second KV split to build
    assert LIBRARY_LINE.search(out) and not (folder / "tts.log").exists()
    assert "| metric | baseline | P | P/baseline |" in out  # -v prints the full tables
