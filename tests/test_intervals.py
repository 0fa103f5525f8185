"""Paired intervals on the speed ratios, `bench.seeds`, and summaries that statistics never
cost: the interval code on cases whose interval is known, runs of 0, 1 and 2 problems,
concordant and discordant, and seeds paired by (problem, seed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tts.config.compose import compose
from tts.results.intervals import RESAMPLES, SEED, ratio_interval, speed_intervals
from tts.results.store import RECORDS, RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "search.n=4", "search.beam_width=2",
        "search.max_iterations=3", "bench.compare=[baseline,PMS]"]
PAIRS = "(problem, seed) pairs behind the 95% intervals (bootstrap over problems)"
SPEED = ["precise goodput (tok/s)", "completion latency (s)", "generator time (s)", "verifier time (s)",
         "problems/min", "generated tokens"]


def bench(tmp_path, *extra, name="run"):
    return run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra]))


def rows_of(summary: dict) -> dict[str, dict]:
    return {r["metric"]: r for r in summary["ratios"]}


def md_row(summary: dict, label: str) -> list[str]:
    line = next(ln for ln in summary["ratio_table_md"].splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


# ------------------------------------------------------------------ the interval code


def test_identical_pairs_give_the_degenerate_interval_at_the_ratio():
    base = [(1.0, 1.0), (3.0, 1.0), (10.0, 1.0)]
    ci = ratio_interval(base, [(2 * x, d) for x, d in base])
    assert (ci.n_pairs, ci.ratio, ci.low, ci.high) == (3, 2.0, 2.0, 2.0)


def test_two_pairs_give_the_percentile_interval_computed_by_hand():
    """Pairs (1 -> 2) and (2 -> 3): a resample is both copies of the first (ratio 2, 1/4),
    both of the second (3/2, 1/4) or one of each (5/3, 1/2); the 2.5% and 97.5% points are
    then 3/2 and 2."""
    ci = ratio_interval([(1.0, 1.0), (2.0, 1.0)], [(2.0, 1.0), (3.0, 1.0)])
    assert ci.ratio == pytest.approx(5 / 3) and (ci.low, ci.high) == (1.5, 2.0)
    assert ci.text() == "[1.5, 2]"


def test_the_interval_is_scipys_own_paired_percentile_bootstrap():
    from scipy.stats import bootstrap

    rng = np.random.default_rng(3)
    base_lat, var_lat = rng.uniform(1, 10, 12), rng.uniform(1, 10, 12)
    ci = ratio_interval([(x, 1.0) for x in base_lat], [(x, 1.0) for x in var_lat])
    want = bootstrap((base_lat, var_lat), lambda b, v, axis=-1: v.mean(axis=axis) / b.mean(axis=axis),
                     paired=True, vectorized=True, n_resamples=RESAMPLES, method="percentile",
                     rng=np.random.default_rng(SEED)).confidence_interval
    assert ci.ratio == pytest.approx(var_lat.sum() / base_lat.sum())
    assert (ci.low, ci.high) == pytest.approx((want.low, want.high), rel=1e-12)
    assert ci.low < ci.ratio < ci.high


def test_the_seeds_of_a_problem_are_resampled_together():
    """The cluster bootstrap is scipy's paired bootstrap over problems, each problem's
    seeds summed; one problem under several seeds has no interval."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(7)
    problems = [p for p in range(6) for _ in range(3)]  # 6 problems x 3 seeds
    # each problem has its own speed-up, its seeds about the same one
    base = rng.uniform(1, 10, 18)
    var = base * np.repeat(rng.uniform(0.5, 2.0, 6), 3) * rng.uniform(0.95, 1.05, 18)
    ci = ratio_interval([(x, 1.0) for x in base], [(x, 1.0) for x in var], problems)
    b, v = base.reshape(6, 3).sum(axis=1), var.reshape(6, 3).sum(axis=1)
    want = bootstrap((b, v), lambda b, v, axis=-1: v.sum(axis=axis) / b.sum(axis=axis), paired=True,
                     vectorized=True, n_resamples=RESAMPLES, method="percentile",
                     rng=np.random.default_rng(SEED)).confidence_interval
    assert (ci.n_pairs, ci.n_problems) == (18, 6) and ci.ratio == pytest.approx(var.sum() / base.sum())
    assert (ci.low, ci.high) == pytest.approx((want.low, want.high), rel=1e-12)
    pairs = ratio_interval([(x, 1.0) for x in base], [(x, 1.0) for x in var])
    assert pairs.high - pairs.low < 0.8 * (ci.high - ci.low)  # 18 independent pairs would claim more
    one = ratio_interval([(1.0, 1.0), (2.0, 1.0)], [(2.0, 1.0), (3.0, 1.0)], ["p", "p"])
    assert one.ratio == pytest.approx(5 / 3) and one.text() == "n/a (1 problem)"


def test_percentile_intervals_invert_with_the_ratio():
    """Problems/min's interval rests on the inverted latency ratio: the percentile interval
    of 1/ratio is the inverted interval of the ratio (up to the interpolation between two
    neighbouring resamples' values)."""
    rng = np.random.default_rng(5)
    base, var = rng.uniform(1, 10, 9), rng.uniform(1, 10, 9)
    lat = ratio_interval([(x, 1.0) for x in base], [(x, 1.0) for x in var])
    per = ratio_interval([(1.0, x) for x in base], [(1.0, x) for x in var])
    assert per.ratio == pytest.approx(1 / lat.ratio)
    assert (per.low, per.high) == pytest.approx((1 / lat.high, 1 / lat.low), rel=1e-6)


def test_too_few_pairs_or_a_zero_baseline_give_no_interval_and_say_why():
    assert ratio_interval([], []).text() == "n/a (0 pairs)"
    one = ratio_interval([(2.0, 1.0)], [(3.0, 1.0)])
    assert one.ratio == 1.5 and one.bounds is None and one.text() == "n/a (1 pair)"
    zero = ratio_interval([(0.0, 1.0), (0.0, 1.0)], [(1.0, 1.0), (2.0, 1.0)])
    assert zero.ratio is None and zero.text() == "n/a (zero baseline)"
    some = ratio_interval([(0.0, 1.0), (2.0, 1.0)], [(1.0, 1.0), (2.0, 1.0)])
    assert some.ratio == 1.5 and some.bounds is None and "zero" in some.text()


def test_speed_intervals_pair_by_problem_and_seed_whatever_the_order():
    def rec(pid, seed, latency):
        return {"problem_id": pid, "seed": seed, "metrics": {
            "latency_s": latency, "generator_s": latency, "verifier_s": 1.0, "gen_tokens": 10,
            "beam_tokens": [10], "beam_completion_s": [latency]}}

    base = [rec("a", 0, 1.0), rec("a", 1, 4.0), rec("b", 0, 2.0)]
    # the same problems and seeds, each twice as slow, listed in another order; one unpaired
    var = [rec("b", 0, 4.0), rec("a", 1, 8.0), rec("a", 0, 2.0), rec("c", 0, 100.0)]
    cis = speed_intervals(base, var)
    assert {k: (c.n_pairs, c.ratio, c.low, c.high) for k, c in cis.items()} == {
        "latency_s_mean": (3, 2.0, 2.0, 2.0), "generator_s_mean": (3, 2.0, 2.0, 2.0),
        "verifier_s_mean": (3, 1.0, 1.0, 1.0), "total_gen_tokens": (3, 1.0, 1.0, 1.0),
        "precise_goodput": (3, 0.5, 0.5, 0.5), "problems_per_min": (3, 0.5, 0.5, 0.5)}
    assert {c.n_problems for c in cis.values()} == {2}  # a and b, a under two seeds
    # problems/min: scaled onto the wall-time ratio the table holds
    scaled = speed_intervals(base, var, {"problems_per_min": 0.4})["problems_per_min"]
    assert (scaled.ratio, scaled.low, scaled.high) == (0.4, pytest.approx(0.4), pytest.approx(0.4))


# ------------------------------------------------------------------ whole runs


def test_one_problem_writes_the_summary_with_intervals_na(tmp_path, capsys):
    """`tts bench dataset.first_k=1` used to stop at the end on scipy's bootstrap; now the
    summary, its ratio table and the printout all come, each interval 'n/a (1 pair)'."""
    from tts.cli_support import print_summary

    path = bench(tmp_path, "dataset.first_k=1")
    summary = json.loads((path / "summary.json").read_text())
    rows = rows_of(summary)
    assert rows[PAIRS]["PMS/baseline"] == 1
    for label in SPEED:
        assert rows[label]["PMS/baseline_ci"] is None and rows[label]["PMS/baseline_ci_note"] == "n/a (1 pair)"
        assert md_row(summary, label)[2].endswith(" n/a (1 pair)")
    assert "n/a (1 pair)" in md_row(summary, "accuracy (majority): paired difference vs the run's first "
                                             "variant, 95% interval, exact McNemar p; the difference 80% power "
                                             "detects")[1]
    print_summary(path)  # the headline
    headline = capsys.readouterr().out
    assert "PMS/baseline (1 pair): goodput ↑ " in headline and "n/a (1 pair)" in headline
    print_summary(path, full=True)
    assert "precise goodput (tok/s)" in capsys.readouterr().out


def _make_discordant(path, first_k: int) -> None:
    """Rewrite the records so that on every problem the baseline is right and PMS wrong."""
    store = RunStore(path)
    records = store.records()
    for r in records:
        right = r["variant"] == "baseline"
        r["correct"] = {m: right for m in r["correct"]}
        r["pass@n"] = right
    assert len(records) == 2 * first_k
    (path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("first_k", [1, 2])
def test_discordant_problems_never_cost_the_summary(tmp_path, first_k):
    """One or two problems the two variants disagree on (constructed records), summarised
    again as `tts eval` does: the paired accuracy has its counts, an interval where two
    pairs allow one, and every speed ratio is there."""
    from tts.results.summary import write_summary

    path = bench(tmp_path, f"dataset.first_k={first_k}")
    _make_discordant(path, first_k)
    (path / "summary.json").unlink()
    summary, _ = write_summary(RunStore(path), ["baseline", "PMS"], {})
    assert json.loads((path / "summary.json").read_text())["ratios"] == json.loads(json.dumps(summary["ratios"]))
    paired = summary["variants"]["PMS"]["paired"]["acc_majority"]
    assert (paired["n"], paired["only_baseline"], paired["diff"]) == (first_k, first_k, -1.0)
    if first_k == 1:
        assert paired["diff_low"] is None and "-1.000 n/a (1 pair), 0:1 discordant" in summary["ratio_table_md"]
    else:  # both pairs say -1: the degenerate interval
        assert (paired["diff_low"], paired["diff_high"]) == (-1.0, -1.0)
    rows = rows_of(summary)
    for label in SPEED:
        assert rows[label]["n_pairs"] == {"PMS": first_k}
        assert (rows[label]["PMS/baseline_ci"] is None) == (first_k == 1)


def test_two_concordant_problems_get_intervals_around_the_ratio(tmp_path):
    path = bench(tmp_path, "dataset.first_k=2")
    summary = json.loads((path / "summary.json").read_text())
    rows = rows_of(summary)
    assert rows[PAIRS]["PMS/baseline"] == 2
    for label in SPEED:
        low, high = rows[label]["PMS/baseline_ci"]
        assert low <= rows[label]["PMS/baseline"] * (1 + 1e-9) and rows[label]["PMS/baseline"] <= high * (1 + 1e-9)
        cell = md_row(summary, label)[2]
        assert cell.count("[") == 1 and cell.endswith("]")


def test_a_variant_with_no_records_keeps_the_summary(tmp_path):
    """0 problems paired: a variant whose records are missing (a run killed before it)
    still gets its summary, with nothing to pair."""
    from tts.results.summary import write_summary

    path = bench(tmp_path, "dataset.first_k=2")
    records = [r for r in RunStore(path).records() if r["variant"] == "baseline"]
    (path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    summary, _ = write_summary(RunStore(path), ["baseline", "PMS"], {})
    assert summary["variants"]["PMS"]["num_problems"] == 0 and "ratio_table_md" in summary
    assert rows_of(summary)[PAIRS]["PMS/baseline"] == 0


def test_a_statistic_that_fails_costs_only_itself(tmp_path, monkeypatch):
    """Whatever a statistic raises on some data, the summary and its table are written,
    and the summary lists what was not computed."""
    import tts.results.summary as summary_module

    def broken(*_):
        raise ValueError("each sample in `data` must contain two or more observations")

    path = bench(tmp_path, "dataset.first_k=2")
    monkeypatch.setattr(summary_module, "paired_accuracy", broken)
    monkeypatch.setattr("tts.results.ratios._add_intervals", broken)
    summary, _ = summary_module.write_summary(RunStore(path), ["baseline", "PMS"], {})
    assert "precise goodput (tok/s)" in summary["ratio_table_md"]
    assert [e.split(":")[0] for e in summary["statistics_errors"]] == ["paired accuracy", "speed intervals"]
    assert json.loads((path / "summary.json").read_text())["statistics_errors"] == summary["statistics_errors"]


def test_seeds_run_every_problem_under_each_and_pair_by_problem_and_seed(tmp_path):
    """`bench.seeds=[0,1]`: every problem once per seed for every variant, each record
    with its seed; the pairs are (problem, seed); a resume that adds a seed runs only it."""
    path = bench(tmp_path, "dataset.first_k=2", "bench.seeds=[0]", name="s")
    assert [(r["variant"], r["seed"]) for r in RunStore(path).records()] == \
        [("baseline", 0), ("PMS", 0), ("PMS", 0), ("baseline", 0)]  # interleaved: A B, B A
    bench(tmp_path, "dataset.first_k=2", "bench.seeds=[0,1]", "bench.resume=true", name="s")
    records = RunStore(path).records()
    keys = [(r["variant"], r["problem_id"], r["seed"]) for r in records]
    assert len(keys) == len(set(keys)) == 8 and keys[:4] == [(v, p, 0) for v, p, _ in keys[:4]]
    assert sorted(k[2] for k in keys[4:]) == [1, 1, 1, 1]
    by_seed = {s: sorted(c["text"] for r in records if r["seed"] == s and r["variant"] == "baseline"
                         for c in r["candidates"]) for s in (0, 1)}
    assert by_seed[0] != by_seed[1]  # another seed samples another tree
    summary = json.loads((path / "summary.json").read_text())
    rows = rows_of(summary)
    assert summary["seeds"] == [0, 1] and rows[PAIRS]["PMS/baseline"] == "4 (2 problems)"
    assert rows["completion latency (s)"]["n_pairs"] == {"PMS": 4}
    assert rows["completion latency (s)"]["n_problems"] == {"PMS": 2}
    assert summary["variants"]["PMS"]["paired"]["acc_majority"]["n"] == 4
    # a run with the seeds from the start writes the same (problem, seed) records
    fresh = RunStore(bench(tmp_path, "dataset.first_k=2", "bench.seeds=[0,1]", name="f")).records()
    assert sorted((r["variant"], r["problem_id"], r["seed"]) for r in fresh) == sorted(keys)


def test_paired_accuracy_pairs_by_problem_and_seed():
    """The same problem under two seeds is two pairs: right under seed 0 and wrong under
    seed 1 for the baseline, the reverse for the variant, is two discordant pairs, not one
    problem compared with itself."""
    from tts.results.records import paired_accuracy

    def rec(seed, right):
        return {"problem_id": "p", "seed": seed, "correct": {"majority": right}, "pass@n": right}

    result = paired_accuracy([rec(0, True), rec(1, False)], [rec(1, True), rec(0, False)])["acc_majority"]
    assert (result["n"], result["only_variant"], result["only_baseline"]) == (2, 1, 1)


def test_repeated_seeds_are_refused():
    from tts.config.compose import validate

    with pytest.raises(Exception, match="bench.seeds"):
        validate(compose("config", ["generator=fake", "verifier=fake", "bench.seeds=[1,1]"]))
