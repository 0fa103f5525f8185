"""One run split into problem shards (`bench.shard=I/K`) and joined again (`tts merge`)."""

import json
import re

import pytest
from typer.testing import CliRunner

from cli.main import app
from tts.config.compose import ConfigError, compose
from tts.problems import shard_of
from tts.saved.merge import merge_runs
from tts.results.store import RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "search.n=4", "search.beam_width=2",
        "search.max_iterations=4", "bench.compare=[baseline,PMS]", "bench.search_variants=[best_of_n]",
        "bench.seeds=[0,1]", "dataset.first_k=7"]


# the refusals, resume and W&B need no more than this
LIGHT = FAKE[:5] + ["bench.compare=[baseline,PMS]", "dataset.first_k=4"]


def run(tmp_path, name, *extra, base=None):
    return run_bench(compose("config", (base or LIGHT) + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}",
                                                          *extra]))


def shards(tmp_path, count=3, *extra, base=None):
    return [run(tmp_path, f"s{i}", f"bench.shard={i}/{count}", *extra, base=base) for i in range(count)]


def untimed(record: dict) -> dict:
    """A record without its timings (and the prefix-cache counts, which depend on what ran
    before it in the process) and without the shard it ran in."""
    from tests.test_results import untimed as without_timing

    out = without_timing(record)
    out.pop("shard", None)
    return out


STATISTICS = ("num_problems", "acc_majority", "acc_majority_ci", "acc_weighted", "acc_weighted_ci", "acc_prm_max",
              "acc_prm_max_ci", "pass@n", "paired", "same_candidates", "tree", "total_gen_tokens", "iterations_mean")


def test_three_shards_merged_are_the_unsharded_run(tmp_path):
    """Shard I of K takes every K-th problem from the I-th, each with every variant and seed;
    merged, the records are the unsharded run's, and so are the summary's accuracy, its
    intervals, the paired differences with McNemar, the tree and the verifier's quality."""
    whole = RunStore(run(tmp_path, "whole", base=FAKE))
    parts = shards(tmp_path, base=FAKE)
    ids = [sorted({r["problem_id"] for r in RunStore(p).records()}) for p in parts]
    assert [len(i) for i in ids] == [3, 2, 2] and not set(ids[0]) & set(ids[1]) | set(ids[1]) & set(ids[2])
    merged = RunStore(merge_runs(parts, tmp_path / "merged"))
    key = lambda r: (r["variant"], r["problem_id"], r["seed"])  # noqa: E731
    assert sorted(map(untimed, merged.records()), key=key) == sorted(map(untimed, whole.records()), key=key)
    assert {r["shard"] for r in merged.records()} == {"0/3", "1/3", "2/3"}
    a, b = whole.summary(), merged.summary()
    assert list(b["variants"]) == ["baseline", "PMS", "best_of_n"] and b["pending"] == []
    for name in a["variants"]:
        for stat in STATISTICS:
            assert b["variants"][name].get(stat) == a["variants"][name].get(stat), (name, stat)
        quality = lambda s: {k: v for k, v in (s["variants"][name].get("verifier_quality") or {}).items()  # noqa: E731
                             if k != "speculation"}
        assert quality(b) == quality(a)
    assert b["tree_lines"] == a["tree_lines"] and b["seeds"] == [0, 1]
    assert [s["shard"] for s in b["shards"]] == ["0/3", "1/3", "2/3"] and sum(s["records"] for s in b["shards"]) == 42
    assert merged.saved_config()["bench"]["shard"] is None
    steps = lambda s, v: s.step_logs()[v]["generator"]["steps"]  # noqa: E731
    assert steps(merged, "PMS") == sum(steps(RunStore(p), "PMS") for p in parts)
    from tts.trace.format import TRACE, read_trace

    assert read_trace(merged.path / TRACE).drift("baseline", "PMS") == read_trace(whole.path / TRACE).drift(
        "baseline", "PMS")
    headline = (merged.path / "summary.md").read_text()
    assert "merged from 3 shards: 0/3 (18 records), 1/3 (12 records), 2/3 (12 records)" in headline


@pytest.mark.parametrize("subset", [["dataset.first_k=7"], ["dataset.first_k=null", "dataset.random_k=9"],
                                    ["dataset.first_k=null", "dataset.levels=[2,3]"],
                                    ["dataset.first_k=null", "dataset.ids=[embedded-1-0,embedded-3-2,embedded-5-4]"]])
def test_the_shards_are_disjoint_and_together_the_selection(subset):
    from tts.config.compose import validate
    from tts.problems import load_problems_for

    selected = [p.id for p in load_problems_for(validate(compose("config", ["generator=fake", *subset])))]
    parts = [[p.id for p in load_problems_for(validate(compose("config", ["generator=fake", *subset,
                                                                          f"bench.shard={i}/4"])))]
             for i in range(4)]
    assert sorted(sum(parts, [])) == sorted(selected) and len(set(sum(parts, []))) == len(selected)
    assert shard_of(selected, None) == selected and shard_of(selected, "1/4") == selected[1::4]


@pytest.mark.parametrize("shard, says", [("3/2", "'3/2': I must be below K"), ("-1/4", "'-1/4' is not I/K"),
                                         ("a/b", "'a/b' is not I/K"), ("1/0", "'1/0' is not I/K")])
def test_a_bad_shard_is_named(shard, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        compose("config", [f"bench.shard={shard}"])


def test_shards_that_are_not_one_run_are_refused_and_nothing_is_written(tmp_path):
    parts = shards(tmp_path, 2)
    other = run(tmp_path, "other", "bench.shard=1/2", "search.n=2")
    out = tmp_path / "merged"
    unstarted = tmp_path / "unstarted"  # a shard killed before its first record
    unstarted.mkdir()
    (unstarted / "config.yaml").write_text((parts[1] / "config.yaml").read_text())
    cases = [
        ([parts[0], other], "ran other configs (search.n: 4 vs 2)"),
        ([parts[0]], "missing shard 1/2 of 2"),
        ([parts[0], parts[0]], "shard 0/2 given twice"),
        ([parts[0], tmp_path / "nothing"], "nothing: no such run folder"),
        ([parts[0], unstarted], "unstarted: not a run folder (no config.yaml or records.jsonl)"),
        ([tmp_path / "unstarted" / "config.yaml"], "merge: no run folder among"),
        ([parts[0], run(tmp_path, "unsharded")], "is no shard (its bench.shard is not set)"),
        ([parts[0], run(tmp_path, "three", "bench.shard=1/3")], "split the run differently"),
    ]
    for given, says in cases:
        with pytest.raises(ConfigError, match=re.escape(says)):
            merge_runs(given, out)
        assert not out.exists() and not list(tmp_path.glob(".merged-*"))
    # a shard run on another problem set would overlap another's problems
    summary = json.loads((parts[1] / "summary.json").read_text())
    summary["pending"] = ["PMS"]
    (parts[1] / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ConfigError, match=re.escape("incomplete shards (resume each with --resume): shard 1/2")):
        merge_runs(parts, out)
    result = CliRunner().invoke(app, ["merge", str(parts[0]), "--out", str(out)])
    assert result.exit_code == 2 and "missing shard 1/2 of 2" in result.output and not out.exists()


def test_overlapping_shards_are_refused(tmp_path):
    a = run(tmp_path, "a", "bench.shard=0/2")
    b = run(tmp_path, "b", "bench.shard=1/2")
    (b / "records.jsonl").write_text((b / "records.jsonl").read_text() + (a / "records.jsonl").read_text()
                                     .splitlines(keepends=True)[0])
    with pytest.raises(ConfigError, match="problem embedded-1-0 is in shard 0/2 .* and shard 1/2 .*the shards overlap"):
        merge_runs([a, b], tmp_path / "merged")


def test_shards_log_into_one_wandb_group_and_the_merge_as_its_run(tmp_path, monkeypatch):
    """Each shard of a sweep logs into one W&B group, its sweep folder's name (or
    `logger.group`); the merged summary logs as a run of that group."""
    import sys
    import types

    inits = []

    class Run:
        summary: dict = {}

        def log(self, *_):
            pass

        def finish(self):
            pass

    fake = types.SimpleNamespace(init=lambda **kw: inits.append(kw) or Run(), Image=lambda path: path,
                                 Table=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sweep = tmp_path / "20261128-000000-sweep"
    on = ["logger.wandb=true", "logger.mode=offline"]
    parts = [run_bench(compose("config", LIGHT + on + [f"bench.results_dir={sweep}", f"bench.run_name={i}",
                                                      f"bench.shard={i}/2"])) for i in range(2)]
    merge_runs(parts, tmp_path / "merged")
    assert [(kw["name"], kw["group"]) for kw in inits] == [("0", sweep.name), ("1", sweep.name), ("merged", sweep.name)]
    inits.clear()
    run(tmp_path, "named", *on, "logger.group=mine", "bench.shard=0/2")
    run(tmp_path, "alone", *on)
    assert [kw["group"] for kw in inits] == ["mine", None]


def test_a_killed_shard_resumes_alone_and_then_merges(tmp_path):
    """A shard killed mid-run is incomplete (the merge says so), resumes on its own with
    `--resume`, and then merges like the others."""
    class Killed(Exception):
        pass

    def kill(variant, record):
        if variant == "PMS":
            raise Killed

    first = run(tmp_path, "s0", "bench.shard=0/2")
    args = LIGHT + [f"bench.results_dir={tmp_path}", "bench.run_name=s1", "bench.shard=1/2"]
    with pytest.raises(Killed):
        run_bench(compose("config", args), progress=kill)
    with pytest.raises(ConfigError, match=re.escape("incomplete shards (resume each with --resume): shard 1/2")):
        merge_runs([first, tmp_path / "s1"], tmp_path / "merged")
    second = run_bench(compose("config", args + ["bench.resume=true"]))
    merged = RunStore(merge_runs([first, second], tmp_path / "merged"))
    assert len(merged.records()) == 4 * 2 and merged.summary()["pending"] == []


def test_a_shard_resumes_with_its_results_dir_given_relative(tmp_path, monkeypatch):
    """A sweep's job records its folder's absolute path; `--resume` with the same folder
    given relative to the working directory continues it (the same folder, the same setting),
    and another folder is still another setting."""
    class Killed(Exception):
        pass

    def kill(variant, record):
        if variant == "PMS":
            raise Killed

    args = LIGHT + ["bench.run_name=0", "bench.shard=0/2"]
    with pytest.raises(Killed):
        run_bench(compose("config", args + [f"bench.results_dir={tmp_path / 'sweep'}"]), progress=kill)
    monkeypatch.chdir(tmp_path)
    resumed = RunStore(run_bench(compose("config", args + ["bench.results_dir=sweep", "bench.resume=true"])))
    assert resumed.path.resolve() == tmp_path / "sweep" / "0"
    assert len(resumed.records()) == 2 * 2 and resumed.summary()["pending"] == []
    assert resumed.config_changes({"bench": {"results_dir": "./sweep/../sweep"}}) == []
    # the resume wrote the folder as it was given
    assert resumed.config_changes({"bench": {"results_dir": "elsewhere"}}) == ["bench.results_dir: 'sweep' -> 'elsewhere'"]


def test_the_documented_merge_of_a_sweep_folder(tmp_path):
    """`tts merge results/<stamp>-sweep/* --out ...` as the shell expands it, which matches the
    sweep's `multirun.yaml` and `sweep.json` too: they are skipped, and said so in one line. The
    sweep folder itself merges alike; paths of which none is a run folder are one clear error."""
    import glob

    from tts.results.store import write_sweep_summary

    sweep = tmp_path / "results" / "20261128-000000-sweep"
    for i in range(2):
        run(sweep, str(i), f"bench.shard={i}/2")
    write_sweep_summary(sweep)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")  # as Hydra's launchers leave it
    expanded = sorted(glob.glob(str(sweep / "*")))
    assert [p.rsplit("/", 1)[1] for p in expanded] == ["0", "1", "multirun.yaml", "sweep.json"]
    cli = CliRunner()
    merged = cli.invoke(app, ["merge", *expanded, "--out", str(tmp_path / "merged")])
    assert merged.exit_code == 0, merged.output
    said = " ".join(merged.output.split())
    assert f"merge: skipped {sweep / 'multirun.yaml'}, {sweep / 'sweep.json'}: not run folders" in said
    records = RunStore(tmp_path / "merged").records()
    assert len(records) == 4 * 2 and {r["shard"] for r in records} == {"0/2", "1/2"}
    whole = cli.invoke(app, ["merge", str(sweep), "--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0 and "skipped" not in whole.output
    assert sorted(map(untimed, RunStore(tmp_path / "whole").records()), key=str) == sorted(map(untimed, records), key=str)
    none = cli.invoke(app, ["merge", *expanded[2:], "--out", str(tmp_path / "none")])
    assert none.exit_code == 2 and "Traceback" not in none.output and not (tmp_path / "none").exists()
    assert "merge: no run folder among" in " ".join(none.output.split())
