"""Accuracy as statistics: intervals on each variant, and paired tests between variants.

"The optimisations change speed, not accuracy" is a claim about many problems; a point
accuracy over a handful says little. So every accuracy comes with a 95% interval, and a
comparison of two variants over the same problems with the paired difference and a test:

- `proportion_interval`: Wilson score interval of k correct out of n (scipy's
  `binomtest(...).proportion_ci(method="wilson")`), sensible at 0/n and n/n too.
- `paired_comparison`: for the problems both variants answered, the difference in
  accuracy (variant minus baseline) with a 95% paired bootstrap interval over problems
  (scipy's `bootstrap(paired=True)`, percentile method, a fixed seed so that re-running the
  summary gives the same numbers; no interval, None, with fewer than 2 pairs: one pair
  says nothing of the spread, and scipy refuses it), the discordant counts (b: only the variant right, c:
  only the baseline right) and the exact McNemar p-value: the two-sided binomial test of
  b against b + c at 1/2 (scipy's `binomtest`), 1.0 when no problem is discordant; and
  `detectable`, the smallest difference this many pairs would find with 80% power at the
  5% level, at the discordant share observed (`detectable_difference`).
- `detectable_difference`: Connor's (1987) normal approximation to McNemar's test,
  n = (z_{1-a/2} sqrt(psi) + z_{1-b} sqrt(psi - d^2))^2 / d^2 with psi the discordant
  share, solved for d (scipy's `brentq`): what a run of this size could have seen, beside
  the interval's half-width, which says what it did see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95
_BOOTSTRAP_RESAMPLES = 4000
_BOOTSTRAP_SEED = 20241124


def proportion_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval for k successes out of n; None for n = 0."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class PairedComparison:
    """A variant against the baseline over the problems both answered."""

    n: int  # problems in common
    baseline_acc: float
    acc: float
    diff: float  # acc - baseline_acc
    diff_low: float | None  # 95% paired bootstrap interval of the difference (None: under 2 pairs)
    diff_high: float | None
    only_variant: int  # discordant: the variant right, the baseline wrong (b)
    only_baseline: int  # discordant: the baseline right, the variant wrong (c)
    mcnemar_p: float  # exact (binomial) McNemar test on the discordant problems
    detectable: float | None = None  # `detectable_difference` at the observed discordant share

    def to_dict(self) -> dict:
        return asdict(self)


def paired_comparison(baseline: Sequence[bool], variant: Sequence[bool],
                      confidence: float = CONFIDENCE) -> PairedComparison | None:
    """Paired difference, interval and exact McNemar test of `variant` against `baseline`,
    two lists of per-problem correctness in the same problem order; None when empty."""
    if len(baseline) != len(variant):
        raise ValueError(f"paired comparison: {len(baseline)} baseline and {len(variant)} variant "
                         "problems; pass the problems both answered, in the same order")
    n = len(baseline)
    if n == 0:
        return None
    import numpy as np
    from scipy.stats import binomtest, bootstrap

    x, y = np.asarray(baseline, dtype=float), np.asarray(variant, dtype=float)
    b = int(np.sum((y == 1) & (x == 0)))
    c = int(np.sum((x == 1) & (y == 0)))
    diff = float(y.mean() - x.mean())
    if n < 2:  # one pair has no spread to resample (scipy's bootstrap refuses it)
        low = high = None
        p = float(binomtest(b, b + c, 0.5).pvalue) if b + c else 1.0
    elif b + c == 0:  # every problem concordant: no evidence of any difference, nothing to resample
        low = high = diff
        p = 1.0
    else:
        res = bootstrap((x, y), lambda a, v, axis=-1: np.mean(v - a, axis=axis), paired=True,
                        vectorized=True, confidence_level=confidence, n_resamples=_BOOTSTRAP_RESAMPLES,
                        method="percentile", rng=np.random.default_rng(_BOOTSTRAP_SEED))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        p = float(binomtest(b, b + c, 0.5).pvalue)
    return PairedComparison(n=n, baseline_acc=float(x.mean()), acc=float(y.mean()), diff=diff,
                            diff_low=low, diff_high=high, only_variant=b, only_baseline=c, mcnemar_p=p,
                            detectable=detectable_difference(n, b + c))


def detectable_difference(n: int, discordant: int, power: float = 0.8,
                          confidence: float = CONFIDENCE) -> float | None:
    """The smallest paired accuracy difference McNemar's test finds with `power` at level
    1 - `confidence` over n pairs of which `discordant` disagree (module docstring); None
    without a discordant pair (no spread to size it by) or where even a difference as large
    as the discordant share could not be found (too few pairs)."""
    import math

    from scipy.optimize import brentq
    from scipy.stats import norm

    if n <= 0 or discordant <= 0:
        return None
    psi = discordant / n
    za, zb = norm.ppf(1 - (1 - confidence) / 2), norm.ppf(power)

    def gap(d: float) -> float:  # the pairs a difference d needs, against the pairs there are
        return za * math.sqrt(psi) + zb * math.sqrt(max(0.0, psi - d * d)) - d * math.sqrt(n)

    top = math.sqrt(psi)
    if gap(top) > 0:
        return None
    return float(brentq(gap, 1e-12, top))
