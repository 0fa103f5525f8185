"""`tts bench --config-name=smoke`: the paper's generator and PRMs, end to end, as the README runs it.

The command runs in a subprocess exactly as a user types it (the CLI, Hydra composition,
the registry's `tiny:` models built on first use, both vLLM engines, the adapters, the
search, the summary), once with each PRM the paper uses that tts can build: Skywork's value
head (vLLM through our plugin) and Qwen2.5-Math-PRM (vLLM's own class, pooled by us).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vLLM is not installed")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("verifier, architecture", [("tiny_skywork_1.5b", "Qwen2ForPrmModel"),
                                                    ("tiny_qwen_prm_7b", "Qwen2ForProcessRewardModel")])
def test_smoke_runs_the_paper_route_on_tiny_checkpoints(tmp_path: Path, verifier: str, architecture: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "cli.main", "bench", "--config-name=smoke", f"verifier={verifier}",
           f"bench.results_dir={tmp_path}", "bench.run_name=smoke"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "smoke"
    config = (run / "config.yaml").read_text()
    assert "tiny:qwen2.5-math-1.5b-instruct" in config and f"tiny:{'skywork-o1-prm-qwen2.5-1.5b' if 'skywork' in verifier else 'qwen2.5-math-prm-7b'}" in config
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["variants"]) == {"baseline", "PMS"}
    for name, variant in summary["variants"].items():
        assert variant["num_problems"] == 2, name
        assert variant["verifier_s_mean"] > 0 and variant["total_gen_tokens"] > 0, name
        assert variant["ver_cache_hit_rate"] > 0, name  # a real PRM reads the prefix cache
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["candidates"] for r in records)
    assert all(0.0 <= c["score"] <= 1.0 for r in records for c in r["candidates"])
    from tts.models.tiny import tiny_path

    built = tiny_path("tiny:" + ("skywork-o1-prm-qwen2.5-1.5b" if "skywork" in verifier else "qwen2.5-math-prm-7b"))
    assert json.loads((built / "config.json").read_text())["architectures"] == [architecture]
    assert "PMS/baseline" in done.stdout
