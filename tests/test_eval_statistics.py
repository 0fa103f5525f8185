"""Accuracy statistics: Wilson intervals, the paired difference and the exact McNemar test,
checked against values computed by hand, and their place in a run's summary."""

import json
import math

import pytest

from eval.statistics import detectable_difference, paired_comparison, proportion_interval


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k, n", [(3, 10), (0, 10), (10, 10), (37, 120), (1, 1)])
def test_wilson_interval_is_the_textbook_one(k: int, n: int) -> None:
    low, high = proportion_interval(k, n)
    want = wilson(k, n)
    assert low == pytest.approx(max(0.0, want[0]), abs=1e-9) and high == pytest.approx(min(1.0, want[1]), abs=1e-9)
    assert proportion_interval(0, 0) is None


def test_mcnemar_is_the_exact_binomial_test_on_the_discordant_problems() -> None:
    # 6 problems only the variant got right, 3 only the baseline: p = 2 P(X <= 3 | 9, 1/2)
    base = [False] * 6 + [True] * 3 + [True] * 10 + [False] * 31
    var = [True] * 6 + [False] * 3 + [True] * 10 + [False] * 31
    r = paired_comparison(base, var)
    assert (r.n, r.only_variant, r.only_baseline) == (50, 6, 3)
    assert r.mcnemar_p == pytest.approx(2 * sum(math.comb(9, i) for i in range(4)) / 2 ** 9)
    assert r.diff == pytest.approx(3 / 50) and r.acc == pytest.approx(16 / 50)
    assert r.diff_low < r.diff < r.diff_high and -1 <= r.diff_low and r.diff_high <= 1
    assert paired_comparison(base, var) == r  # seeded: the summary is reproducible


def test_a_large_paired_difference_is_significant_and_none_is_not() -> None:
    base = [False] * 40 + [True] * 10
    var = [True] * 30 + [False] * 10 + [True] * 10
    r = paired_comparison(base, var)
    assert r.mcnemar_p < 1e-6 and r.diff_low > 0.3
    same = paired_comparison(base, base)
    assert (same.diff, same.diff_low, same.diff_high, same.mcnemar_p) == (0.0, 0.0, 0.0, 1.0)
    assert paired_comparison([], []) is None
    with pytest.raises(ValueError, match="same order"):
        paired_comparison([True], [True, False])


def test_the_detectable_difference_is_found_by_mcnemar_with_80_percent_power() -> None:
    """At the difference `detectable_difference` returns, simulated runs of that many pairs
    with that discordant share reject with McNemar's exact test about 80% of the time (the
    exact test is a little conservative against the normal approximation)."""
    import numpy as np
    from scipy.stats import binomtest

    n, discordant = 150, 30
    d = detectable_difference(n, discordant)
    psi = discordant / n
    assert 0 < d < psi
    rng = np.random.default_rng(0)
    runs = rng.multinomial(n, [(psi + d) / 2, (psi - d) / 2, 1 - psi], size=2000)
    power = np.mean([binomtest(int(b), int(b + c), 0.5).pvalue < 0.05 for b, c, _ in runs])
    assert 0.7 < power < 0.88
    assert detectable_difference(4 * n, 4 * discordant) == pytest.approx(d / 2, rel=0.05)  # 4x the pairs: half
    assert detectable_difference(n, 0) is None and detectable_difference(3, 1) is None
    assert paired_comparison([False] * 10, [False] * 10).detectable is None  # nothing discordant to size it by


def test_a_comparison_summary_carries_intervals_and_paired_tests(tmp_path) -> None:
    from tts.config.compose import compose
    from tts.runner import run_bench

    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=6", "search.n=4",
                             "search.beam_width=2", "search.max_iterations=3", "bench.compare=[baseline,PMS]",
                             f"bench.results_dir={tmp_path}", "bench.run_name=s"])
    summary = json.loads((run_bench(cfg) / "summary.json").read_text())
    base, pms = summary["variants"]["baseline"], summary["variants"]["PMS"]
    low, high = base["acc_majority_ci"]
    assert low <= base["acc_majority"] <= high and base["num_graded"] == 6
    paired = pms["paired"]["acc_majority"]
    assert paired["n"] == 6 and paired["diff"] == pytest.approx(pms["acc_majority"] - base["acc_majority"])
    assert 0.0 <= paired["mcnemar_p"] <= 1.0 and "paired" not in base
    table = summary["ratio_table_md"]
    assert "accuracy (majority), 95% interval" in table and "exact McNemar p" in table


def test_search_variants_join_the_comparison_on_the_same_problems(tmp_path) -> None:
    """`bench.search_variants` adds best-of-N and self-consistency (baseline engine, the run's
    N) to the compared variants: same problems, paired against the first variant."""
    from tts.config.compose import compose
    from tts.results.store import RunStore
    from tts.runner import run_bench

    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
                             "search.beam_width=2", "search.max_iterations=3", "bench.compare=[baseline,PMS]",
                             "bench.search_variants=[best_of_n,self_consistency]",
                             f"bench.results_dir={tmp_path}", "bench.run_name=v"])
    path = run_bench(cfg)
    records = RunStore(path).records()
    names = ["baseline", "PMS", "best_of_n", "self_consistency"]
    # interleaved one problem a round: the listed order, then reversed
    assert [r["variant"] for r in records[:8]] == names + names[::-1]
    assert sorted(r["variant"] for r in records) == sorted(names * 3)
    assert all(len(r["candidates"]) == 4 for r in records)
    sc = [r for r in records if r["variant"] == "self_consistency"]
    assert all(c["score"] is None for r in sc for c in r["candidates"])  # no verifier: majority only
    summary = json.loads((path / "summary.json").read_text())
    assert list(summary["variants"]) == names
    assert summary["variants"]["self_consistency"]["paired"]["acc_majority"]["n"] == 3


def test_an_unknown_search_variant_names_the_choices() -> None:
    from tts.config.compose import ConfigError, compose, validate
    from tts.assembly.variants import run_variants

    cfg = validate(compose("config", ["generator=fake", "verifier=fake", "bench.search_variants=[bon]"]))
    with pytest.raises(ConfigError, match="unknown search preset 'bon'; valid choices: beam, beam_dedup, best_of_n"):
        run_variants(cfg)
    one = validate(compose("config", ["generator=fake", "verifier=fake", "bench.search_variants=[self_consistency@1]"]))
    assert [(name, search.n) for name, _, search in run_variants(one)] == [("baseline", 8), ("self_consistency@1", 1)]


def test_a_search_variant_is_the_runs_own_search_with_what_its_preset_sets() -> None:
    """A search variant keeps the run's search settings its preset does not set:
    `beam_dedup` is the run's beam search (N, M, iterations, aggregation) with duplicates
    filtered; `best_of_n` changes the algorithm and nothing the run chose."""
    from tts.assembly.variants import run_variants
    from tts.config.compose import compose, validate

    cfg = validate(compose("config", ["generator=fake", "verifier=fake", "search.n=6", "search.beam_width=3",
                                      "search.max_iterations=7", "search.aggregation=min",
                                      "bench.search_variants=[beam_dedup,best_of_n]"]))
    (_, _, run), (_, _, dedup), (_, _, bon) = run_variants(cfg)
    assert not run.filter_duplicates and dedup.filter_duplicates
    assert (dedup.algorithm, dedup.n, dedup.beam_width, dedup.max_iterations, dedup.aggregation) == (
        run.algorithm, 6, 3, 7, run.aggregation)
    assert bon.algorithm == "best_of_n" and bon.aggregation.value == "last" and bon.n == 6


def test_the_greedy_variant_is_one_path_at_temperature_zero() -> None:
    """`greedy` (conf/search/greedy.yaml) is the single-sample reference: one path at
    temperature 0, whatever the run's N and generator.temperature; a greedy search with
    more paths is refused, naming the field."""
    import dataclasses

    from tts.config.compose import ConfigError, compose, validate
    from tts.assembly.build import engine_options
    from tts.assembly.variants import run_variants

    cfg = validate(compose("config", ["generator=fake", "verifier=fake", "generator.temperature=0.7",
                                      "bench.search_variants=[greedy,self_consistency]"]))
    variants = {name: (optim, search) for name, optim, search in run_variants(cfg)}
    temps = {name: engine_options(dataclasses.replace(cfg, search=search), optim).temperature
             for name, (optim, search) in variants.items()}
    assert temps == {"baseline": 0.7, "greedy": 0.0, "self_consistency": 0.7}
    assert variants["greedy"][1].n == 1 and variants["self_consistency"][1].n == 8
    with pytest.raises(ConfigError, match="search.n: n=4 greedy paths"):
        validate(compose("config", ["generator=fake", "verifier=fake", "search=greedy", "search.n=4"]))
