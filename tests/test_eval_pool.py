"""eval.pool inside the workers of Hydra's launchers: a joblib (loky) worker and a Ray task grade
an answer that needs the grading pool, and exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval.grader import _Pending, _prepare

ROOT = Path(__file__).resolve().parents[1]
GOLD, PRED = "\\frac{\\sqrt{3}}{2}", "The answer is \\boxed{\\sqrt{3}/2}"  # equal, but not as literals

JOB = f'''
import json, os


def job():
    import torch  # noqa: F401  (loaded, as in a tts job: the grading workers spawn)
    from eval.grader import grade_answer
    from eval.pool import start_method

    verdict = grade_answer({GOLD!r}, {PRED!r})
    return {{"pid": os.getpid(), "method": start_method(), "reason": verdict.reason}}
'''

JOBLIB = JOB + '''

if __name__ == "__main__":
    from joblib import Parallel, delayed

    # n_jobs=2: with one, joblib would run the job in this process
    done = Parallel(n_jobs=2, backend="loky")(delayed(job)() for _ in range(1))
    print(json.dumps({"parent": os.getpid(), **done[0]}), flush=True)
'''

RAY = JOB + '''

if __name__ == "__main__":
    import ray

    ray.init(num_cpus=1, include_dashboard=False)
    done = ray.get(ray.remote(job).remote())
    print(json.dumps({"parent": os.getpid(), **done}), flush=True)
    ray.shutdown()
'''


def run_script(tmp_path: Path, text: str) -> dict:
    """Run `text` as a script (a spawned worker re-imports it, so it is a file) and return the
    JSON line it prints. The timeout only turns a hang (a worker waiting on its grading pool at
    exit) into a failure."""
    script = tmp_path / "job.py"
    script.write_text(text)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_answer_needs_the_pool() -> None:
    assert isinstance(_prepare(GOLD, PRED), _Pending)


def test_a_joblib_worker_grades_with_the_pool_and_exits(tmp_path: Path) -> None:
    """The pool spawns its workers from the loky worker, whose default start method "loky" a
    fresh interpreter does not know; and the loky worker exits when joblib ends (it shuts its
    pool down before multiprocessing joins its children)."""
    got = run_script(tmp_path, JOBLIB)
    assert got["pid"] != got["parent"]  # graded in a loky worker
    assert (got["method"], got["reason"]) == ("spawn", "correct")


def test_a_ray_task_grades_with_the_pool(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (TTS_EXTRAS=ray bash cli/install.sh)")
    got = run_script(tmp_path, RAY)
    assert got["pid"] != got["parent"]  # graded in a Ray worker
    assert (got["method"], got["reason"]) == ("spawn", "correct")
