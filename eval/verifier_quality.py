"""How good the verifier is, measured in the run that used it.

A PRM-guided search and FlashTTS's speculation both rest on the verifier ranking paths
better than chance. Two measures, from what every run records:

- `final_auroc`: over the final candidates of every graded problem, the probability that a
  right answer's path scores above a wrong one's (the Mann-Whitney AUROC, ties counted a
  half; scipy's `mannwhitneyu`). Its 95% interval is a percentile bootstrap over problems
  (a problem's candidates are resampled together: they share a tree), scipy's `bootstrap`
  with a fixed seed. None where no problem has both a right and a wrong candidate.
- `speculation_vs_chance`: the speculation hit rate beside its chance level, the share of
  candidates selection keeps (1/M for beam search: N/M of N); a previous-step score that
  predicts nothing gives about that rate.

`at_chance` says whether either measure cannot be told from chance: then PRM-guided
selection and speculation's priority cannot help, and a speed-up is not FlashTTS's.
"""

from __future__ import annotations

from collections.abc import Sequence

from eval.statistics import CONFIDENCE

_RESAMPLES = 2000
_SEED = 20261125
CHANCE_MARGIN = 0.05  # a hit rate within this of chance is at chance


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
    mixed = [i for i, p in enumerate(problems) if p]
    if len(mixed) >= 2:
        import numpy as np
        from scipy.stats import bootstrap

        def statistic(index: np.ndarray) -> float:
            chosen = [c for i in index for c in problems[int(i)] if c[0] is not None]
            value = auroc([s for s, ok in chosen if ok], [s for s, ok in chosen if not ok])
            return 0.5 if value is None else value  # a resample without both kinds says nothing

        result = bootstrap((np.array(mixed),), statistic, vectorized=False, n_resamples=_RESAMPLES,
                           confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(_SEED))
        out["ci"] = [float(result.confidence_interval.low), float(result.confidence_interval.high)]
    return out


def speculation_vs_chance(hit_rate: float | None, kept_share: float) -> dict | None:
    """The speculation hit rate, its chance level (the share selection keeps) and whether it
    is within `CHANCE_MARGIN` of it; None without speculation."""
    if hit_rate is None:
        return None
    return {"hit_rate": hit_rate, "chance": kept_share, "at_chance": abs(hit_rate - kept_share) <= CHANCE_MARGIN}


def at_chance(auroc_result: dict | None, speculation: dict | None) -> bool:
    """Whether the verifier cannot be told from a coin: its AUROC interval holds 0.5, or
    speculation hits at its chance rate."""
    if auroc_result is not None and auroc_result.get("ci") and auroc_result["ci"][0] <= 0.5 <= auroc_result["ci"][1]:
        return True
    return bool(speculation and speculation["at_chance"])
