"""A replay says whether it runs the code and options that recorded its trace
(`tts.replay.provenance`), and where each replayed variant first left its recording
(`tts.replay.served.Divergence`): on fake-backend traces, in the summary and the first line."""

import gzip
import json
from pathlib import Path

from tts.replay.provenance import UNKNOWN
from tts.replay.run import run_replay
from tts.results.host import host_line
from tts.results.store import RunStore
from tts.trace.format import TRACE, read_trace
from tts.trace.provenance import code_identity

from tests.test_replay import bench

DOCS_RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"


def replayed(path, overrides=(), name="replay"):
    out = run_replay(path, list(overrides), run_name=name)
    summary = RunStore(out).summary()
    return summary, host_line(summary["host"]), (out / "summary.md").read_text()


def rewrite_trace(path, edit):
    """The run's trace with each line passed through `edit` (None drops it)."""
    lines = [json.loads(line) for line in gzip.decompress((path / TRACE).read_bytes()).decode().splitlines()]
    kept = [e for e in map(edit, lines) if e is not None]
    (path / TRACE).write_bytes(gzip.compress("".join(json.dumps(e) + "\n" for e in kept).encode()))


def test_a_trace_records_its_code_and_each_variants_options(tmp_path):
    path = bench(tmp_path, "bench.compare=[baseline,PMS]", "dataset.first_k=1")
    (provenance,) = read_trace(path / TRACE).provenance
    assert provenance["code"] == code_identity() and provenance["code"]["id"]
    assert set(provenance["variants"]) == {"baseline", "PMS"}
    pms = provenance["variants"]["PMS"]
    assert pms["speculative"] is True and pms["schedule"] == "flash" and pms["search.beam_width"] == 2
    assert "seed" not in pms and pms["adaptive.early_exit"] is False


def test_a_replay_through_the_same_code_and_options_reports_no_divergence(tmp_path):
    path = bench(tmp_path, "bench.compare=[baseline,PMS,decoupled]")
    summary, first, md = replayed(path)
    simulated = summary["simulated"]
    assert simulated["provenance"]["status"] == "same" and simulated["provenance"]["code"] == "same"
    assert simulated["divergence"] == {} and summary["host"]["provenance"]["status"] == "same"
    assert "same code and options as recorded" in first and "left its recording" not in first
    assert "every replayed variant kept to its recording" in md


def test_a_replay_with_another_option_names_it_and_its_first_divergence(tmp_path):
    """score_cache off: the replayed baseline scores a step again that it scored once when
    recorded; a wider beam: it extends a prefix no variant extended."""
    path = bench(tmp_path, "bench.compare=[baseline]")
    summary, first, md = replayed(path, ["bench.optim_overrides=[score_cache=false]"])
    simulated = summary["simulated"]
    assert simulated["provenance"]["status"] == "other" and simulated["provenance"]["code"] == "same"
    assert simulated["provenance"]["options"] == {"baseline": {"score_cache": [True, False]}}
    diverged = simulated["divergence"]["baseline"]
    problems = {r["problem_id"] for r in RunStore(path).records()}
    assert diverged["variant"] == "baseline" and diverged["problem"] in problems and diverged["kind"] == "score"
    assert diverged["iteration"] >= 2 and diverged["step"] >= 1 and "never asked for" in diverged["what"]
    assert "other options (baseline: score_cache)" in first
    assert f"baseline left its recording at problem {diverged['problem']}, iteration {diverged['iteration']}" in first
    assert "score_cache true recorded, false replaying" in md and "baseline left its recording" in md

    summary, first, _ = replayed(path, ["search.beam_width=4"], name="wider")
    diverged = summary["simulated"]["divergence"]["baseline"]
    assert summary["simulated"]["provenance"]["options"]["baseline"] == {"search.beam_width": [2, 4]}
    assert diverged["kind"] == "generation" and diverged["problem"] in problems and diverged["prefix_tokens"] > 0
    assert diverged["drawn_token_share"] > 0 and "drawn" in diverged["what"]


def test_a_trace_from_other_code_is_named_as_such(tmp_path):
    path = bench(tmp_path, "bench.compare=[baseline]", "dataset.first_k=1")
    old = {"tts": "0.0.9", "vllm": None, "commit": "0" * 40, "dirty": False, "id": "git 000000000000"}
    rewrite_trace(path, lambda e: {**e, "code": old} if e["t"] == "p" else e)
    summary, first, md = replayed(path)
    provenance = summary["simulated"]["provenance"]
    mine = code_identity()["id"]
    assert provenance["status"] == "other" and provenance["code"] == "other" and provenance["recorded"] == [old]
    said = f"replayed through other code (recorded by git 000000000000, replaying with {mine})"
    assert said in first and said in md and provenance["options"] == {}


def test_a_trace_from_before_provenance_replays_labelled_unknown(tmp_path):
    assert read_trace(DOCS_RUNS / "sharded_joblib" / TRACE).provenance == []  # the study runs' traces read
    path = bench(tmp_path, "bench.compare=[baseline]", "dataset.first_k=1")
    rewrite_trace(path, lambda e: None if e["t"] == "p" else e)
    summary, first, md = replayed(path)
    assert summary["simulated"]["provenance"]["status"] == "unknown"
    assert summary["host"]["provenance"]["status"] == "unknown"
    assert UNKNOWN == "provenance unknown (recorded before tts recorded it)" and UNKNOWN in first and UNKNOWN in md
    assert summary["simulated"]["divergence"] == {}  # the divergence is watched all the same


def test_a_resume_records_its_provenance_once_more_only_where_it_differs(tmp_path):
    first = ["dataset.first_k=1"]
    bench(tmp_path, "bench.compare=[baseline]", *first)
    path = bench(tmp_path, "bench.compare=[baseline]", "bench.resume=true")
    raw = gzip.decompress((path / TRACE).read_bytes()).decode()
    assert raw.count('"t":"p"') == 2 and len(read_trace(path / TRACE).provenance) == 1
