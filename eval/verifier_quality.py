"""How good the verifier is, measured in the run that used it.

A PRM-guided search and FlashTTS's speculation both rest on the verifier ranking paths
better than chance. Two measures, from what every run records:

- `final_auroc`: over the final candidates of every graded problem, the probability that a
  right answer's path scores above a wrong one's (the Mann-Whitney AUROC, ties counted a
  half; scipy's `mannwhitneyu`). Its 95% interval is a percentile bootstrap over problems
  (a problem's candidates are resampled together: they share a tree), scipy's `bootstrap`
  with a fixed seed. None where no problem has both a right and a wrong candidate.
- `selection_prediction`: in every search run, how well a candidate's path score before
  its newest step predicts whether selection keeps it, the bet FlashTTS's speculation makes
  when it lets the best-scored beams run on. Per ranking selection (`selection_events`): the
  Spearman correlation of the previous score with kept (scipy's `spearmanr`), and the hit
  rate of the previous score's own top k (the share of them selection kept) beside its
  chance level k/n (1/M for beam search). Means over selections, with 95% intervals over
  problems.
- `speculation_vs_chance`: the speculation hit rate of a speculative variant beside the same
  chance level; a previous-step score that predicts nothing gives about that rate.

`at_chance` says whether a measure cannot be told from chance: then PRM-guided selection and
speculation's priority cannot help, and a speed-up is not FlashTTS's.
"""

from __future__ import annotations

from collections.abc import Sequence

from eval.statistics import CONFIDENCE

_RESAMPLES = 2000
_SEED = 20261125
CHANCE_MARGIN = 0.05  # a hit rate within this of chance is at chance
AUROC_AT_CHANCE = "the final-path AUROC's interval holds 0.5"  # the one reason about selection, not ranking ahead


def auroc(right: Sequence[float], wrong: Sequence[float]) -> float | None:
    """P(a right path's score > a wrong one's), ties a half; None without both kinds."""
    if not right or not wrong:
        return None
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu(right, wrong, alternative="two-sided").statistic
    return float(u) / (len(right) * len(wrong))


def final_auroc(problems: Sequence[Sequence[tuple[float, bool]]]) -> dict | None:
    """The AUROC of final-path scores for right against wrong answers, pooled over problems
    ((score, correct) per candidate, one list per problem), with its 95% interval over
    problems and the counts it rests on; None when it is undefined."""
    pooled = [c for p in problems for c in p if c[0] is not None]
    value = auroc([s for s, ok in pooled if ok], [s for s, ok in pooled if not ok])
    if value is None:
        return None
    out = {"auroc": value, "n_right": sum(ok for _, ok in pooled), "n_wrong": sum(not ok for _, ok in pooled),
           "n_problems": len(problems), "ci": None}

    def statistic(index) -> float:
        chosen = [c for i in index for c in problems[int(i)] if c[0] is not None]
        value = auroc([s for s, ok in chosen if ok], [s for s, ok in chosen if not ok])
        return 0.5 if value is None else value  # a resample without both kinds says nothing

    out["ci"] = _over_problems([i for i, p in enumerate(problems) if p], statistic)
    return out


def _over_problems(indices: list[int], statistic) -> list[float] | None:
    """A 95% percentile-bootstrap interval of `statistic(resampled problem indices)`
    (problems resampled whole: their candidates share a tree); None below 2 problems."""
    if len(indices) < 2:
        return None
    import numpy as np
    from scipy.stats import bootstrap

    result = bootstrap((np.array(indices),), statistic, vectorized=False, n_resamples=_RESAMPLES,
                       confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(_SEED))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return None if low != low or high != high else [low, high]


def selection_events(selections: Sequence[tuple[Sequence[float], Sequence[bool]]]) -> dict:
    """One problem's ranking selections ((previous path scores, kept) each), measured: per
    selection the Spearman correlation of previous score with kept (None where the previous
    scores are all equal), the previous score's top-k hit rate, and its chance k/n."""
    from scipy.stats import spearmanr

    rho, hits, chance = [], [], []
    for previous, kept in selections:
        k, n = sum(kept), len(kept)
        if not 0 < k < n:
            continue
        varied = len(set(previous)) > 1
        rho.append(float(spearmanr(previous, kept).statistic) if varied else None)
        best = sorted(range(n), key=lambda i: (-previous[i], i))[:k]  # ties: earlier, as selection
        hits.append(sum(kept[i] for i in best) / k)
        chance.append(k / n)
    return {"rho": rho, "hits": hits, "chance": chance}


def selection_prediction(problems: Sequence[dict]) -> dict | None:
    """Over problems' `selection_events`: the mean rank correlation and the mean top-k hit
    rate beside its chance level, each with a 95% interval over problems; None without a
    selection whose candidates had previous scores."""
    events = [p for p in problems if p and p.get("hits")]
    if not events:
        return None

    def pooled(index, key: str) -> float:
        values = [v for i in index for v in events[int(i)][key] if v is not None]
        return sum(values) / len(values) if values else 0.0

    every = list(range(len(events)))
    varied = any(v is not None for p in events for v in p["rho"])
    return {
        "rho": pooled(every, "rho") if varied else None,
        "rho_ci": _over_problems(every, lambda i: pooled(i, "rho")) if varied else None,
        "hit_rate": pooled(every, "hits"),
        "hit_rate_ci": _over_problems(every, lambda i: pooled(i, "hits")),
        "chance": pooled(every, "chance"),
        "selections": sum(len(p["hits"]) for p in events),
        "n_problems": len(events),
    }


def speculation_vs_chance(hit_rate: float | None, kept_share: float) -> dict | None:
    """The speculation hit rate, its chance level (the share selection keeps) and whether it
    is no more than `CHANCE_MARGIN` above it (below chance predicts no better); None without
    speculation."""
    if hit_rate is None:
        return None
    return {"hit_rate": hit_rate, "chance": kept_share, "at_chance": hit_rate - kept_share <= CHANCE_MARGIN}


def at_chance(auroc_result: dict | None, speculation: dict | None, selection: dict | None = None) -> list[str]:
    """Which measures cannot tell the verifier from a coin (empty: none): its AUROC interval
    holds 0.5, the previous score's top-k hit rate is no more than `CHANCE_MARGIN` above
    chance, or speculation's is (a rate below chance predicts no better than a coin)."""
    why = []
    if auroc_result is not None and auroc_result.get("ci") and auroc_result["ci"][0] <= 0.5 <= auroc_result["ci"][1]:
        why.append(AUROC_AT_CHANCE)
    if selection is not None and selection["hit_rate"] - selection["chance"] <= CHANCE_MARGIN:
        why.append("the previous score's top k are kept at or below the chance rate")
    if speculation and speculation["at_chance"]:
        why.append("speculation hits at or below the chance rate")
    return why
