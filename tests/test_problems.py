"""The problems a run takes: a prompt longer than the engines hold is skipped with its
reason, before any model loads, and the run goes on; a dataset the hub cannot give is a
one-line error."""

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from tts.config.compose import ConfigError, compose, validate
from tts.config.limits import PROMPT_ROOM
from tts.models.cache import is_present
from tts.problems import fit_prompts, load_problems_for
from tts.results.store import RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "search.n=4", "search.beam_width=2",
        "search.max_iterations=3"]
LONG = "What is " + " + ".join(["1"] * 600) + "?"  # 2,4k characters: the fake's tokens are characters


def write_rows(path, problems):
    path.write_text("".join(json.dumps({"problem": p, "answer": "2", "unique_id": f"u{i}"}) + "\n"
                            for i, p in enumerate(problems)))
    return path


def test_a_prompt_longer_than_the_engines_hold_is_skipped_and_the_run_goes_on(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", ["What is 1 + 1?", LONG, "What is 3 - 1?"])
    cfg = compose("config", FAKE + ["dataset=math500", f"dataset.path={rows}", "dataset.first_k=null",
                                    f"bench.results_dir={tmp_path}", "bench.run_name=run",
                                    "bench.compare=[baseline,PMS]"])
    path = run_bench(cfg)
    store = RunStore(path)
    assert sorted({(r["variant"], r["problem_id"]) for r in store.records()}) == [
        ("PMS", "math500-0"), ("PMS", "math500-2"), ("baseline", "math500-0"), ("baseline", "math500-2")]
    [skipped] = store.skipped()
    tokens = skipped["prompt_tokens"]
    assert skipped["problem_id"] == "math500-1" and tokens > PROMPT_ROOM and skipped["limit"] == PROMPT_ROOM
    assert skipped["reason"].startswith(f"prompt of {tokens} tokens, over the 1024 the engines hold for a prompt")
    summary = store.summary()
    assert summary["num_skipped"] == 1 and summary["skipped"] == [skipped]
    assert summary["variants"]["baseline"]["num_problems"] == 2


def test_a_run_whose_every_prompt_is_too_long_is_refused_naming_them(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [LONG])
    cfg = compose("config", FAKE + ["dataset=math500", f"dataset.path={rows}", f"bench.results_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"dataset: no selected problem's prompt fits the engines: math500-0: "
                                          r"prompt of \d+ tokens, over the 1024"):
        run_bench(cfg)
    assert not list(tmp_path.glob("*/config.yaml"))  # refused before any run folder


@pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                    reason="default model not pulled (tts models pull smollm2-135m-instruct)")
def test_the_default_generators_tokenizer_measures_the_prompt(tmp_path):
    """SmolLM2's tokenizer and chat template, without its engine: a MATH-style row of about
    18k tokens is skipped, a short one kept."""
    long = "Compute the sum " + " ".join(f"a_{i} = {i}," for i in range(3000)) + " then add them."
    rows = write_rows(tmp_path / "rows.jsonl", ["What is 1 + 1?", long])
    cfg = validate(compose("config", ["dataset=math500", f"dataset.path={rows}", "dataset.first_k=null"]))
    kept, skipped = fit_prompts(cfg, load_problems_for(cfg))
    assert [p.id for p in kept] == ["math500-0"]
    assert skipped[0]["problem_id"] == "math500-1" and skipped[0]["prompt_tokens"] > 15000


@pytest.mark.parametrize("args", [["--config-name=ceiling"], ["--config-name=config", "dataset=math500"]])
def test_a_dataset_the_hub_cannot_give_is_a_one_line_error(args, tmp_path, monkeypatch):
    import datasets

    def offline(*_, **__):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("TTS_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", *args, "logger=none"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # typer.Exit(2), not the DatasetLoadError
    assert "error: could not load Hugging Face dataset 'HuggingFaceH4/MATH-500'" in " ".join(result.output.split())
    assert "dataset.path=" in result.output
