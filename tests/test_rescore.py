"""`tts rescore`: a run's recorded candidates scored by a verifier, without generating."""

import json

import pytest

from tts.config.compose import ConfigError, compose
from tts.saved.rescore import candidate_steps, rescore_run
from tts.results.store import RECORDS, RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
        "search.beam_width=2", "search.max_iterations=4"]


def test_candidate_steps_are_the_recorded_ones_or_cut_at_the_boundary():
    c = {"text": "a\n\nbb\n\nccc", "step_ends": [3, 7, 10], "num_steps": 3}
    assert candidate_steps(c) == (["a\n\n", "bb\n\n", "ccc"], True)
    assert candidate_steps({"text": c["text"]}) == (["a\n\n", "bb\n\n", "ccc"], False)
    assert candidate_steps({"text": ""}) == ([], False)


def test_the_runs_own_verifier_gives_back_the_recorded_scores(tmp_path):
    """Rescoring with the run's own (deterministic) verifier scores every step as the
    search did: each candidate's new path score is its recorded one, so both AUROCs and
    both verifiers' picks agree; a run from before `step_ends` is cut at "\\n\\n", and says
    how many candidates that cut into another number of steps."""
    run = run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=r"]))
    folder, text = rescore_run(run, [], tmp_path / "out")
    result = json.loads((folder / "rescore.json").read_text())
    base = result["variants"]["baseline"]
    assert base["problems"] == 3 and base["candidates"] == 12 and base["resegmented"] == 0
    assert base["auroc"]["recorded"] == base["auroc"]["rescored"]
    assert base["accuracy"]["weighted@recorded"] == base["accuracy"]["weighted@rescored"]
    assert text.startswith("host: ") and "| baseline |" in text
    # the same run recorded without step_ends
    records = RunStore(run).records()
    # a path cut off by max_iterations writes the rest in its last step, boundaries and all:
    # only those come back cut into another number of steps
    capped = 0
    for r in records:
        for c in r["candidates"]:
            ends = c.pop("step_ends")
            capped += "\n\n" in c["text"][ends[-2] if len(ends) > 1 else 0:ends[-1]].rstrip("\n")
    assert 0 < capped < 12
    (run / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    folder, _ = rescore_run(run, [], tmp_path / "old")
    old = json.loads((folder / "rescore.json").read_text())["variants"]["baseline"]
    assert old["resegmented"] == capped and old["candidates"] == 12
    assert old["auroc"]["recorded"] == base["auroc"]["recorded"]


def test_a_folder_that_is_no_run_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not a run folder"):
        rescore_run(tmp_path, [])
