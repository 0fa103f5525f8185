"""`tts report` over conf/paper_fig12.yaml's sweep and its replays (issue 67, item 4), on the
fake backend: the runs recorded for the RTX 4090 with the 7B+1.5B pair at two values of n,
replayed there (nothing drawn) and replayed at the datasheet's prices with another beam width
(much drawn). The report's scaling section shows each variant's ratios, counters and drawn
shares as the runs' own summaries hold them, and takes the gain apart: the tree against the
schedule (`PMS_branches_prune`) and one optimisation at a time (P, PM, PMS), each step a
paired ratio of two variants of one run over its problems."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tts.config.compose import compose
from tts.replay.run import run_replay
from tts.report import write_report
from tts.report.ablation import LADDER, carrier, log_share
from tts.report.scaling import DRAWN_LIMIT, legend_labels, over_drawn, run_line, source_of, tree_basis
from tts.report.sources import load_folder
from tts.results.intervals import speed_intervals
from tts.results.ratios import ratio
from tts.results.store import RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset=embedded", "dataset.first_k=2",
        "search.beam_width=2", "search.max_iterations=5"]
CARD = ["device=rtx4090", "generator=qwen2.5-math-7b", "verifier=skywork_1.5b"]
# the datasheet's prices, and a beam width the recording never ran: the replay draws
DRAWING = ["replay.step_costs=datasheet", "search.beam_width=4"]
NS = (4, 8)
COUNTERS = ("gen_preemptions", "gen_recomputed_tokens", "gen_evictions")


@pytest.fixture(scope="module")
def fig12(tmp_path_factory) -> dict[str, Path]:
    """Run folders by name: the recorded sweep's jobs, their replays on the card, and the
    drawing replays; and the report over all of them ("report")."""
    root = tmp_path_factory.mktemp("fig12")
    folders = {}
    for n in NS:
        recorded = run_bench(compose("paper_fig12", FAKE + [f"search.n={n}", f"bench.results_dir={root / 'sweep'}",
                                                            f"bench.run_name=recorded-n{n}"]))
        folders[recorded.name] = recorded
        for kind, extra in (("card", []), ("drawing", DRAWING)):
            path = run_replay(recorded, [*CARD, *extra], root / kind, run_name=f"{kind}-n{n}")
            folders[path.name] = path
    folders["report"] = write_report([str(root / "sweep"), str(root / "card"), str(root / "drawing")],
                                     out=root / "report")
    return folders


def _scaling(fig12) -> dict:
    return json.loads((fig12["report"].parent / "report.json").read_text())["scaling"]


def _summary(folder: Path) -> dict:
    return RunStore(folder).summary()


def _goodput(summary: dict, a: str, b: str) -> float:
    return ratio(summary["variants"][a]["precise_goodput"], summary["variants"][b]["precise_goodput"])


def test_every_variant_of_the_sweep_and_its_replays_is_a_row_with_its_own_counters(fig12):
    """Each run (recorded, replayed on the card, replayed drawing) at each n gives one row per
    variant; its goodput ratio is its summary's over the baseline's, its counters its
    summary's own, printed in the table."""
    data = _scaling(fig12)
    compare = list(_summary(fig12["recorded-n4"])["variants"])
    assert compare == ["paper_baseline", "P", "PM", "PMS", "PMS_branches_prune"]
    assert {(r["run"], r["variant"]) for r in data["rows"]} == {
        (f"{kind}-n{n}", v) for kind in ("recorded", "card", "drawing") for n in NS for v in compare}
    text = fig12["report"].read_text()
    for r in data["rows"]:
        summary = _summary(fig12[r["run"]])
        assert r["simulated"] == (not r["run"].startswith("recorded"))
        if r["simulated"]:
            assert "rtx4090 Qwen2.5-Math-7B-Instruct+" in r["source"]
        assert [r[k] for k in COUNTERS] == [summary["variants"][r["variant"]][k] for k in COUNTERS]
        if r["variant"] != "paper_baseline":
            assert r["precise_goodput"] == pytest.approx(_goodput(summary, r["variant"], "paper_baseline"), rel=1e-12)
            assert r["precise_goodput_ci"] is not None and r["pairs"] == 2
    head = "| n | source | variant | goodput / baseline [95%] | latency / baseline [95%] | "
    assert head in text and all(f"| {label} |" in text for label in ("gen preempted", "gen recomputed tokens",
                                                                       "gen evicted"))


def test_each_simulated_row_shows_the_share_its_replay_drew(fig12):
    """A replay on the card the trace was recorded for draws nothing; one at a beam width the
    recording never ran draws, and its rows say how much, marked over the limit; measured rows
    have none."""
    data = _scaling(fig12)
    drew_over = False
    for r in data["rows"]:
        served = (_summary(fig12[r["run"]]).get("simulated") or {}).get("served", {}).get(r["variant"])
        if served is None:
            assert r["drawn_token_share"] is None and r["drawn_score_share"] is None
            continue
        assert (r["drawn_token_share"], r["drawn_score_share"]) == (served["drawn_token_share"],
                                                                     served["drawn_score_share"])
        if r["run"].startswith("card"):
            assert served["drawn_token_share"] == served["drawn_score_share"] == 0
        drew_over |= served["drawn_token_share"] > DRAWN_LIMIT
    assert drew_over  # the drawing replays drew: the marks below are of real shares
    lines = [line for line in fig12["report"].read_text().splitlines() if line.startswith("| ")]
    for r in data["rows"]:
        if r["run"].startswith("drawing") and r["drawn_token_share"] > DRAWN_LIMIT:
            mark = f"| {r['drawn_token_share']:.1%} (over {DRAWN_LIMIT:.0%}) |"
            assert any(f"| {r['variant']} |" in line and mark in line and f"| {r['n']} |" in line for line in lines)
    for line in lines:
        if "| measured on " in line and "| paper_baseline |" in line:
            assert "| - | - | - |" in line  # pairs, drawn tokens, drawn scores


def test_the_gain_is_taken_apart_from_the_runs_own_paired_ratios(fig12):
    """Per run: P/baseline, PM/P and PMS/PM are the quotients of the summaries' goodputs, each
    with the paired interval over the two variants' own records (resampled by problem), and
    they multiply to PMS/baseline; the schedule alone (PMS_branches_prune/baseline) times the
    tree (PMS/PMS_branches_prune) is PMS/baseline too, and the most drawn share of each line is
    the largest of its variants'."""
    data = _scaling(fig12)
    runs = {name for name in fig12 if name != "report"}
    assert {r["run"] for r in data["steps"]} == runs == {r["run"] for r in data["tree"]}
    for r in data["steps"]:
        folder = fig12[r["run"]]
        summary, run = _summary(folder), load_folder(folder)
        chain = ["paper_baseline", *LADDER]
        for before, after in zip(chain, chain[1:]):
            step = after[-1]
            assert r[step] == pytest.approx(_goodput(summary, after, before), rel=1e-12)
            ci = speed_intervals(run.variant_records(before), run.variant_records(after))["precise_goodput"]
            assert r[f"{step}_ci"] == ci.bounds and r[f"{step}_pairs"] == ci.n_pairs == 2
        assert r["P"] * r["M"] * r["S"] == pytest.approx(r["pms"], rel=1e-9)
        assert r["pms"] == pytest.approx(_goodput(summary, "PMS", "paper_baseline"), rel=1e-12)
        assert r["carries"] == carrier(r, ["P", "M", "S"])
        shares = [s for v in chain for s in run.drawn_shares(v) if s is not None]
        assert r["drawn"] == (max(shares) if shares else None)
    for r in data["tree"]:
        summary = _summary(fig12[r["run"]])
        assert r["schedule"] == pytest.approx(_goodput(summary, "PMS_branches_prune", "paper_baseline"), rel=1e-12)
        assert r["tree"] == pytest.approx(_goodput(summary, "PMS", "PMS_branches_prune"), rel=1e-12)
        assert r["schedule"] * r["tree"] == pytest.approx(r["pms"], rel=1e-9)
        assert r["schedule_share"] == (math.log(r["schedule"]) / math.log(r["pms"]) if r["pms"] > 1 else None)
    text = fig12["report"].read_text()
    assert "### The tree against the schedule" in text and "### One optimisation at a time" in text
    for r in data["steps"]:
        line = next(ln for ln in text.split("### One optimisation at a time", 1)[1].splitlines()
                    if ln.startswith(f"| {r['n']} | {r['source']} |") and f"| {r['carries']} |" in ln
                    and f"| {r['M']:.2f}x {r['M_text']} |" in ln)
        assert f"| {r['S']:.2f}x {r['S_text']} |" in line


def test_the_step_that_carries_the_gain_and_the_schedules_share():
    """The largest step carries a gain, marked within noise where its interval holds 1; with
    no gain the line names the step that costs most; the schedule's share is its log share of
    a gain, none without one."""
    row = {"P": 1.1, "P_ci": [1.05, 1.2], "M": 0.9, "M_ci": [0.8, 1.0], "S": 1.5, "S_ci": [0.9, 2.0]}
    assert carrier({**row, "pms": 1.1 * 0.9 * 1.5}, ["P", "M", "S"]) == "S (within noise)"
    assert carrier({**row, "S": 1.01, "pms": 1.1 * 0.9 * 1.01}, ["P", "M", "S"]) == "no gain; M costs most"
    assert carrier({**row, "S_ci": None, "pms": 2.0}, ["P", "M", "S"]) == "S (no interval)"
    assert carrier({**row, "P": 2.0, "pms": 2.0 * 0.9 * 1.5}, ["P", "M", "S"]) == "P"
    assert log_share(2.0, 4.0) == pytest.approx(0.5) and log_share(1.2, 0.9) is None and log_share(0.5, 2.0) == -1


def test_a_replay_on_the_baselines_tree_is_named_so_and_its_trees_are_one(fig12, tmp_path):
    """A replay that serves every variant the baseline's recording (`replay.tree`) says so in
    its source, and its variants' trees are one; the recording itself, in bf16, grew each
    variant's own tree, and says that instead. The plot's legend says once what every line
    shares, and each line what is its own."""
    tree = load_folder(run_replay(fig12["recorded-n4"], [*CARD, "replay.tree=paper_baseline"], tmp_path,
                                  run_name="tree-n4"))
    card, recorded = load_folder(fig12["card-n4"]), load_folder(fig12["recorded-n4"])
    assert source_of(tree)["label"] == source_of(card)["label"] + ", on paper_baseline's tree"
    assert tree_basis(tree) == "one: paper_baseline's (replay.tree)"
    grown = card.host["recorded_on"]
    assert (grown["dtype"], grown["sampler"]) != ({"generator": "float32", "verifier": "float32"}, "position")
    assert tree_basis(card) == tree_basis(recorded) == \
        f"each its own ({'/'.join(sorted(set(grown['dtype'].values())))}, {grown['sampler']} sampler)"
    float32 = {**recorded.host, "sampler": "position", "dtype": {"generator": "float32", "verifier": "float32"}}
    assert tree_basis(dataclasses.replace(recorded, host=float32)) == \
        "one unless rounding parts them (float32, position sampler)"
    rows = {r.name: run_line(r) for r in (card, tree)}
    common, labels = legend_labels({row["source"]: row for row in rows.values()})
    assert common == f"simulated on rtx4090 {rows['card-n4']['pair']} (measured prices)"
    assert labels == {rows["card-n4"]["source"]: "", rows["tree-n4"]["source"]: "on paper_baseline's tree"}


def test_a_cell_over_the_drawn_limit_is_marked_in_table_and_plot(fig12):
    """Every drawing replay's row over the limit is marked (`over_drawn`, hollow on the plot),
    and no row of the replays that drew nothing is."""
    rows = _scaling(fig12)["rows"]
    for r in rows:
        shares = [s for s in (r["drawn_token_share"], r["drawn_score_share"]) if s is not None]
        assert over_drawn(r) == any(s > DRAWN_LIMIT for s in shares)
    assert any(over_drawn(r) for r in rows if r["run"].startswith("drawing"))
    assert not any(over_drawn(r) for r in rows if not r["run"].startswith("drawing"))
