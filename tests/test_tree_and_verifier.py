"""The tree beside the schedule and the verifier beside chance (`tts.results.tree`,
`eval.verifier_quality`): constructed cases with known answers, and fake-backend runs."""

import json

import pytest

from eval.verifier_quality import (
    at_chance,
    auroc,
    final_auroc,
    selection_events,
    selection_prediction,
    speculation_vs_chance,
)
from tts.config.compose import compose
from tts.results.store import RunStore
from tts.results.summary import write_summary
from tts.results.tree import diversity, tree_line, tree_stats, verifier_line
from tts.runner import run_bench
from tts.trace.format import Trace

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
        "search.beam_width=2", "search.max_iterations=4", "generator.step_max_tokens=20"]


def test_auroc_on_a_constructed_case():
    # right 0.9, 0.8 against wrong 0.1, 0.85: 3 of the 4 pairs ordered right
    assert auroc([0.9, 0.8], [0.1, 0.85]) == pytest.approx(0.75)
    assert auroc([0.5], [0.5]) == pytest.approx(0.5)  # a tie counts a half
    assert auroc([0.9], []) is None


def test_final_auroc_pools_problems_and_bootstraps_over_them():
    perfect = [[(0.9, True), (0.1, False)], [(0.8, True), (0.2, False)], [(0.7, True), (0.3, False)]]
    result = final_auroc(perfect)
    assert result["auroc"] == 1.0 and result["ci"] == [1.0, 1.0]
    assert (result["n_right"], result["n_wrong"], result["n_problems"]) == (3, 3, 3)
    coin = [[(0.9, True), (0.9, False)], [(0.1, True), (0.1, False)], [(0.5, False), (0.5, True)]]
    coin_result = final_auroc(coin)
    assert coin_result["auroc"] == pytest.approx(0.5) and coin_result["ci"][0] <= 0.5 <= coin_result["ci"][1]
    assert final_auroc([[(0.9, False)], [(0.2, False)]]) is None  # nothing right: undefined


def test_a_verifier_at_chance_is_flagged():
    spec = speculation_vs_chance(0.24, 0.25)  # the N=16, M=4 judge
    assert spec["at_chance"] and at_chance(None, spec)
    good = {"auroc": 0.8, "ci": [0.7, 0.9], "n_right": 10, "n_wrong": 30, "n_problems": 8}
    assert not at_chance(good, speculation_vs_chance(0.6, 0.25))
    assert at_chance({**good, "ci": [0.45, 0.7]}, None)
    why = at_chance(good, spec)
    assert why == ["speculation hits at or below the chance rate"]
    assert speculation_vs_chance(0.35, 0.5)["at_chance"]  # below chance is no better than a coin
    line = verifier_line({"auroc": good, "speculation": spec, "at_chance": True, "at_chance_why": why})
    assert "AT CHANCE (speculation hits at or below the chance rate)" in line and "0.24 against 0.25 by chance" in line
    assert "speculation's priority cannot help" in line
    assert "AT CHANCE" not in verifier_line({"auroc": good, "speculation": None, "at_chance": False})
    weak = {**good, "ci": [0.45, 0.7]}
    line = verifier_line({"auroc": weak, "speculation": None, "at_chance_why": at_chance(weak, None)})
    assert "AT CHANCE (the final-path AUROC's interval holds 0.5)" in line and "selection cannot help accuracy" in line


def test_the_previous_score_against_selection_on_constructed_cases():
    """Selection kept the two best of four by the new step's score. Where the previous score
    ranks the same way, its top 2 are the kept 2 (hit rate 1 against chance 0.5, Spearman
    with kept 2/sqrt(5)); where it ranks the other way, none; equal previous scores say nothing."""
    kept = (True, True, False, False)
    agree = selection_events([((0.9, 0.8, 0.2, 0.1), kept)])
    assert agree["hits"] == [1.0] and agree["chance"] == [0.5]
    assert agree["rho"][0] == pytest.approx(2 / 5 ** 0.5)
    against = selection_events([((0.1, 0.2, 0.8, 0.9), kept)])
    assert against["hits"] == [0.0] and against["rho"][0] == pytest.approx(-2 / 5 ** 0.5)
    assert selection_events([((0.5,) * 4, kept)])["rho"] == [None]
    assert selection_events([((0.5, 0.4), (True, True))]) == {"rho": [], "hits": [], "chance": []}
    result = selection_prediction([agree, agree, against])
    assert result["hit_rate"] == pytest.approx(2 / 3) and result["chance"] == 0.5
    assert result["selections"] == 3 and result["n_problems"] == 3
    assert result["hit_rate_ci"][0] <= 2 / 3 <= result["hit_rate_ci"][1]
    assert result["hit_rate_ci"][0] == 0.0 and result["hit_rate_ci"][1] == 1.0  # 3 problems: all agree or none
    assert selection_prediction([{}, {"rho": [], "hits": [], "chance": []}]) is None
    coin = {"rho": 0.0, "rho_ci": None, "hit_rate": 0.27, "hit_rate_ci": None, "chance": 0.25, "selections": 9,
            "n_problems": 3}
    assert at_chance(None, None, coin) and not at_chance(None, None, {**coin, "hit_rate": 0.6})
    line = verifier_line({"auroc": None, "selection": coin, "speculation": None, "at_chance_why": at_chance(None, None, coin)})
    assert "its top-k kept 0.27 against 0.25 by chance (9 selections)" in line and "AT CHANCE" in line


def test_every_search_run_measures_the_previous_score_against_selection(tmp_path):
    """Beam search on the fake backend: each record carries its selections, and the summary
    the previous score's rank correlation and hit rate beside chance, for every variant."""
    path = run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=s",
                                               "bench.compare=[baseline,PMS]"]))
    summary = json.loads((path / "summary.json").read_text())
    for name in ("baseline", "PMS"):
        selection = summary["variants"][name]["verifier_quality"]["selection"]
        assert selection["selections"] > 0 and 0 < selection["chance"] < 1
        assert 0.0 <= selection["hit_rate"] <= 1.0
        assert "the previous step's score predicts selection" in summary["verifier_lines"][name]
    records = [json.loads(line) for line in (path / "records.jsonl").read_text().splitlines()]
    assert sum(len(r["selection"]["hits"]) for r in records if r["variant"] == "baseline") == summary["variants"]["baseline"][
        "verifier_quality"]["selection"]["selections"]


def test_diversity_counts_clones_and_distinct_answers():
    cands = [{"text": t, "answer": a} for t, a in (("x", "1"), ("x", "1"), ("y", "1"), ("z", None), ("x", "1"))]
    one = {"candidates": cands}
    other = {"candidates": [{"text": "p", "answer": "2"}, {"text": "q", "answer": "3"}]}
    assert diversity([one]) == {"identical_candidates_mean": 3, "unique_answers_mean": 1}
    assert diversity([one, other]) == {"identical_candidates_mean": 1.5, "unique_answers_mean": 1.5}
    assert diversity([]) == {}
    base = {"iterations": 4, "identical_candidates_mean": 1.0}
    line = tree_line("PMS", {**base, "identical_candidates_mean": 5.0}, base, 0.5, "vllm")
    assert "5.0 identical final candidates per problem against 1.0" in line


def test_tree_stats_and_line():
    records = [{"metrics": {"iterations": 4, "ver_requests": 10},
                "candidates": [{"num_steps": 2, "num_tokens": 40, "text": "a"}, {"num_steps": 4, "num_tokens": 40, "text": "b"}]}]
    stats = tree_stats(records)
    assert stats == {"iterations": 4, "steps_per_path": 3.0, "tokens_per_step": pytest.approx(80 / 6),
                     "verifier_calls": 10, "identical_candidates_mean": 0, "unique_answers_mean": 0}
    longer = {**stats, "iterations": 2.0, "tokens_per_step": 2 * stats["tokens_per_step"]}
    line = tree_line("PMS", longer, stats, 0.5, "vllm")
    assert line.startswith("PMS grew a different tree (0.5x iterations") and "2x tokens per step" in line
    assert "PMS_branches_prune keeps the baseline's tree" in line
    assert "PMS_exact" in tree_line("PMS", longer, stats, 0.5, "position")
    control = tree_line("PMS", longer, stats, 0.5, "position", kept_by="PMS_branches_prune")
    assert "PMS_branches_prune grew the baseline's tree in this run" in control and "PMS_exact" not in control
    assert tree_line("PMS", longer, stats, 1.0, "vllm") is None
    numerics = tree_line("PMS_branches_prune", stats, stats, 0.5, "position", drift={"differed": 3, "shared": 100})
    assert "3 of the 100 requests it sent as the baseline did" in numerics and "different search" not in numerics
    assert "different search" in tree_line("PMS", longer, stats, 0.5, "position", drift={"differed": 0, "shared": 100})


def test_a_traces_drift_counts_the_same_requests_that_sampled_other_tokens():
    """Requests two variants sent with one prompt and seed: with a resumable sampler their
    tokens differ only where the logits did, over the shorter output (a cut-off speculative
    request that agrees so far does not count)."""
    trace = Trace({})
    def sent(variant, seed, h, out):
        trace.add({"t": "g", "v": variant, "seed": seed, "h": h, "o": out, "f": "stop"})
    sent("baseline", 1, 10, [1, 2, 3]); sent("B", 1, 10, [1, 2, 3])  # the same
    sent("baseline", 2, 10, [1, 2, 3]); sent("B", 2, 10, [1, 2])  # cut off, agrees so far
    sent("baseline", 1, 11, [1, 2, 3]); sent("B", 1, 11, [1, 5, 3])  # the logits moved
    sent("baseline", 3, 12, [4]); sent("B", 4, 12, [5])  # other seeds: not the same request
    assert trace.drift("baseline", "B") == (1, 3)
    assert trace.drift("baseline", "nobody") == (0, 0)


def test_a_summary_counts_the_drift_of_a_variant_that_kept_no_final_candidate(tmp_path):
    """`describe` reads the run's trace for every variant whose final candidates differ,
    none of them the same (share 0) included, and the tree line then blames numerics."""
    import gzip

    from tts.trace.format import VERSION
    from tts.results.tree import describe

    lines = [{"t": "h", "version": VERSION}, {"t": "g", "v": "baseline", "seed": 1, "h": 5, "o": [1, 2], "f": "stop"},
             {"t": "g", "v": "B", "seed": 1, "h": 5, "o": [1, 3], "f": "stop"}]
    trace = tmp_path / "trace.jsonl.gz"
    trace.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    record = {"metrics": {"iterations": 2, "ver_requests": 1}, "candidate_correct": [False],
              "candidates": [{"num_steps": 1, "num_tokens": 5, "text": "a", "score": None}]}
    summary = {"variants": {"baseline": {}, "B": {"same_candidates": 0.0}}, "host": {"sampler": "position"}}
    describe(summary, {"baseline": [record], "B": [dict(record)]}, {}, trace)
    assert summary["variants"]["B"]["tree"]["sampling_drift"] == {"differed": 1, "shared": 1}
    assert "1 of the 1 requests it sent as the baseline did" in summary["tree_lines"][0]


def test_a_summary_names_the_variant_of_the_run_that_kept_the_first_ones_tree_as_the_control():
    from tts.results.tree import describe

    record = {"metrics": {"iterations": 2, "ver_requests": 1},
              "candidates": [{"num_steps": 1, "num_tokens": 5, "text": "a"}]}
    variants = {"baseline": {}, "B": {"same_candidates": 0.5}, "C": {"same_candidates": 1.0}}
    summary = {"variants": variants, "host": {"sampler": "position"}}
    describe(summary, {name: [dict(record)] for name in variants}, {})
    (line,) = summary["tree_lines"]
    assert line.startswith("B grew a different tree") and "C grew the baseline's tree in this run" in line


@pytest.mark.parametrize("variant, differs", [("PMS_exact", False), ("PMS", True)])
def test_the_tree_line_appears_only_when_the_trees_differ(tmp_path, variant, differs):
    """On the fake backend, PMS_exact keeps the baseline's tree (resumable sampling), and
    PMS's duplicates restart inside child 0's step (the paper's rule): another tree."""
    # the fake's steps are short ("d1 w3.\n\n"): a duplicate that samples its last 4 tokens
    # samples the step it would have anyway, so PMS keeps the tree; Algorithm 1 as written
    # (spec_own_min_tokens=0) keeps whole steps on high draws, and the tree moves
    path = run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=r",
                                               f"bench.compare=[baseline,{variant}]", "optim.spec_own_min_tokens=0"]))
    summary = json.loads((path / "summary.json").read_text())
    assert bool(summary["tree_lines"]) == differs, summary["tree_lines"]
    assert summary["variants"][variant]["tree"]["iterations"] > 0
    if differs:
        assert summary["tree_lines"][0].startswith(f"{variant} grew a different tree")
        # the fake backend's tokens are a function of prompt and seed: no request drifted, so
        # the line blames the search, and a trace that is no trace costs only the count
        drift = summary["variants"][variant]["tree"]["sampling_drift"]
        assert drift["differed"] == 0 and drift["shared"] > 0 and "different search" in summary["tree_lines"][0]
        (path / "trace.jsonl.gz").write_bytes(b"not a trace")
        again, _ = write_summary(RunStore(path), ["baseline", variant], {})
        assert again["tree_lines"] == summary["tree_lines"] and "sampling_drift" not in again["variants"][variant]["tree"]


def test_a_bound_above_the_measured_time_says_the_cost_model_does_not_fit(monkeypatch):
    """A 'least time' longer than the measured one is no bound: the fit does not hold for
    this run, and the table says so (with the fit's r2) instead of a share above 1."""
    from tts.metrics.cost_model import CostModel
    from tts.results import summary as summary_mod

    monkeypatch.setattr(summary_mod, "work_bounds", lambda *a, **k: {"gen_bound_s": 3.0, "ver_bound_s": 1.0})
    monkeypatch.setattr(summary_mod, "work_of", lambda *a, **k: None)  # the above-bound split: not this test's
    monkeypatch.setattr(summary_mod, "above_bound", lambda *a, **k: None)
    model = CostModel(step_s=0.01, per_decode_seq_s=0.001, per_prefill_token_s=0.0001, steps=20, r2=0.29)
    s = {"latency_s_mean": 2.0}
    summary_mod.add_bounds(s, [{"metrics": {"latency_s": 2.0}}], {"generator": model, "verifier": None})
    assert s["bound_share"] == 2.0  # kept as measured, for whatever reads the number
    assert "does not fit" in s["bound_fit_note"] and "r2 0.29" in s["bound_fit_note"]
    rows = summary_mod.ratio_table({"baseline": s}, "baseline")
    share = next(r for r in rows if r.get("key") == "bound_share" or r["metric"].startswith("latency bound / latency"))
    # the table says why there is no share; the number field holds none
    assert share["baseline"] is None and share["baseline_note"] == s["bound_fit_note"]
    assert f"| {share['metric']} | {s['bound_fit_note']} |" in summary_mod.format_table(rows, ["baseline"], "baseline")


def test_the_headline_is_short_and_the_full_tables_are_kept(tmp_path):
    """`tts bench` ends with a headline of at most about 15 lines (ratios with intervals, the
    tree line); the full tables are in summary.md, which `tts report RUN` prints."""
    from typer.testing import CliRunner

    from cli.main import app

    args = ["bench", *FAKE, f"bench.results_dir={tmp_path}", "bench.run_name=h", "bench.compare=[baseline,PMS]",
            "optim.spec_own_min_tokens=0"]  # the paper's rule: another tree (see above)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    after = lines[next(i for i, line in enumerate(lines) if line.startswith("host: ")):]
    # the headline: at most 14 lines (the host line wrapped as the CPU's name needs), then
    # where the results, plots and log are
    paths = [line for line in after if line.startswith(("results:", "plots:", "log "))]
    assert len(after) - len(paths) <= 14 and len(paths) <= 3, result.output
    # every ratio says which way is better; 3 pairs are flagged as a draw; no line over 160
    assert any(line.startswith("ratios to baseline") and "↑ higher is better, ↓ lower is better" in line
               for line in after)
    ratios = next(line for line in after if line.startswith("PMS/baseline (3 pairs): "))
    assert "goodput ↑ " in ratios and "latency ↓ " in ratios and "x [" in ratios
    assert any(line.startswith("only 3 pairs: these intervals are a draw") for line in after)
    assert all(len(line) <= 160 for line in after if not line.startswith(("results:", "plots:", "log ")))
    assert any(line.startswith("PMS grew a different tree") for line in after)
    assert f"`tts report {tmp_path / 'h'}` prints them" in result.output and "tts bench -v" not in result.output
    full = (tmp_path / "h" / "summary.md").read_text()
    assert "| metric | baseline | PMS | PMS/baseline |" in full and "| precise_goodput |" in full
    report = CliRunner().invoke(app, ["report", str(tmp_path / "h"), "--out", str(tmp_path / "rep")])
    assert report.exit_code == 0 and "| metric | baseline | PMS | PMS/baseline |" in report.output


def test_eight_pairs_need_no_warning_and_the_goodput_plot_carries_its_intervals(tmp_path, monkeypatch):
    """With 8 or more pairs the headline gives no small-sample warning; the goodput bars
    carry the paired interval the ratio table gives (the label and an error bar)."""
    from tts.config.compose import compose
    from tts.results import plots
    from tts.results.headline import headline
    from tts.results.store import RunStore
    from tts.runner import run_bench

    texts = []
    real = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, **k: (
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts), real(fig, path, **k))[1])
    path = run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=e",
                                               "bench.compare=[baseline,P]", "dataset.first_k=8"]))
    summary = RunStore(path).summary()
    lines = headline(summary, RunStore(path).saved_config())
    assert any(line.startswith("P/baseline (8 pairs): ") for line in lines)
    assert not any(line.startswith("only ") for line in lines)
    row = next(r for r in summary["ratios"] if r.get("key") == "precise_goodput")
    low, high = row["P/baseline_ci"]
    assert f"{row['P/baseline']:.2f}x\n[{low:.2f}, {high:.2f}]" in texts


def test_a_search_variant_differs_by_design_not_by_numerics(tmp_path):
    """Greedy (temperature 0) and best-of-N sample otherwise than the beam search on purpose:
    their tree line says so, and no sampling drift is counted for them (a request with the
    baseline's prompt and seed samples other tokens at another temperature by design)."""
    import json

    from tts.config.compose import compose
    from tts.runner import run_bench

    path = run_bench(compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3",
                                        "search.n=4", "search.beam_width=2", "search.max_iterations=4",
                                        "bench.search_variants=[greedy]", "generator.dtype=bfloat16",
                                        f"bench.results_dir={tmp_path}", "bench.run_name=r"]))
    summary = json.loads((path / "summary.json").read_text())
    assert summary["variants"]["greedy"]["same_candidates"] < 1.0
    assert "sampling_drift" not in summary["variants"]["greedy"]["tree"]
    [line] = summary["tree_lines"]
    assert line.startswith("greedy grew a different tree") and "numerics" not in line
    assert line.endswith("another search by design (bench.search_variants: greedy: algorithm self_consistency, "
                         "n 1, temperature 0.0), not a schedule of the same one")
    assert "by design" not in (tree_line("PMS", summary["variants"]["greedy"]["tree"],
                                         summary["variants"]["baseline"]["tree"], 0.5, "vllm") or "")
