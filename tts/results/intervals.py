"""Paired 95% intervals on the speed ratios of a variant against a baseline (the run's
first variant in the summary; `tts report`'s baseline column).

Pairs. Every variant runs the same problems under the same seeds (`bench.seeds`), so a
variant's record and the baseline's with the same (problem, seed) (`pair_key`) form a
pair; problem difficulty, the largest source of spread (a tree of 7 iterations against
one of 40), is then shared by both sides of the ratio. Only pairs both ran count.

What is resampled: problems, each with all of its seeds' pairs (a cluster bootstrap).
The seeds of one problem share its difficulty, so they are not independent pairs:
resampling (problem, seed) pairs one by one would narrow the interval as if 3 problems
under 2 seeds were 6 problems. Resampling problems keeps the seed-to-seed spread inside
each problem's sums, and the interval speaks for problems like these, not only for these
problems. With one seed a problem is a pair. With one problem there is no interval (its
seeds say nothing of other problems): "n/a (1 problem)", or "n/a (1 pair)".

Ratios. Each speed metric is a ratio of sums over the pairs, `sum(num) / sum(den)` per
side, and the ratio is the variant's over the baseline's, the same definition as the
summary's point values (so with every problem paired the interval's own point estimate is
the ratio table's):

- precise goodput: a path's tokens over its completion time, pooled over paths:
  sum of path tokens / sum of path completion seconds (`summarize_problems`);
- completion latency, generator time, verifier time: the mean per problem (den = 1 each);
- generated tokens: the total (the same pairs on both sides, so the ratio of totals is the
  ratio of means);
- problems/min: 60 n / wall time of the variant, where problems may overlap in time
  (`bench.concurrency`), so it has no per-problem part. Its interval is the bootstrap
  interval of the per-problem analogue, sum of baseline latencies / sum of variant
  latencies (problems per second of latency: the mean latency ratio inverted), scaled by
  the measured problems/min ratio over that analogue's full-sample value. That assumes
  the relative spread problem sampling puts on the latency ratio is the spread it puts on
  the wall-time ratio: exact up to the gaps between problems at concurrency 1, an
  approximation with problems in flight together.

The bootstrap. scipy's `bootstrap(paired=True)` resamples pair indices (the two sides'
arrays together, so a resample keeps its pairs), `n_resamples=4000`, a fixed seed so
re-writing a summary gives the same numbers. Method: percentile, not BCa. BCa's
acceleration comes from a jackknife that is unstable with a handful of pairs (3 to 8 is
this toolkit's usual run) and undefined (NaN, with a warning) when every resample gives
the same value, e.g. identical pairs; the percentile interval is defined there (the
degenerate interval at the ratio), and it is transformation-respecting: the interval of
1/ratio is the inverted interval of the ratio (up to interpolating between two resamples),
so latency and problems/min read the same. Under 2 problems there is no interval; a
ratio undefined in some resample (a zero-time denominator) has none either, with the
reason. Nothing here raises on data: a summary is never lost to its statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tts.results.records import pair_key

CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 20241124

Part = Callable[[dict], tuple[float, float]]  # a record's metrics -> (numerator, denominator)


def _mean_of(key: str) -> Part:
    return lambda m: (float(m[key]), 1.0)


def _goodput(m: dict) -> tuple[float, float]:
    return float(sum(m["beam_tokens"])), float(sum(m["beam_completion_s"]))


def _per_latency(m: dict) -> tuple[float, float]:
    return 1.0, float(m["latency_s"])


# summary key -> the per-record parts of its ratio of sums (module docstring)
SPEED_PARTS: dict[str, Part] = {
    "precise_goodput": _goodput,
    "latency_s_mean": _mean_of("latency_s"),
    "problems_per_min": _per_latency,
    "total_gen_tokens": _mean_of("gen_tokens"),
    "generator_s_mean": _mean_of("generator_s"),
    "verifier_s_mean": _mean_of("verifier_s"),
}
WALL_SCALED = {"problems_per_min"}  # the interval is scaled onto the wall-time ratio


@dataclass(frozen=True)
class RatioInterval:
    """A variant's paired ratio to the baseline on one metric, with its 95% interval."""

    n_pairs: int  # (problem, seed) pairs
    ratio: float | None  # over the pairs (None: no pair, or a zero baseline)
    low: float | None  # None: no interval, `note` says why
    high: float | None
    note: str | None = None
    n_problems: int | None = None  # the units resampled (None: as many as pairs)

    @property
    def bounds(self) -> list[float] | None:
        return None if self.low is None or self.high is None else [self.low, self.high]

    def text(self) -> str:
        """"[1.05, 1.41]", or the reason there is none ("n/a (1 pair)")."""
        return bounds_text(self.bounds, self.note)


def bounds_text(bounds: list[float] | None, note: str | None = None) -> str:
    """An interval as the tables print it: "[1.05, 1.41]", or the reason there is none."""
    if bounds is None:
        return note or "n/a"
    return f"[{_g(bounds[0])}, {_g(bounds[1])}]"


def _g(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def pairs_of(baseline: list[dict], variant: list[dict]) -> list[tuple[dict, dict]]:
    """(baseline record, variant record) for each (problem, seed) both ran, in the
    variant's order."""
    base = {pair_key(r): r for r in baseline}
    return [(base[pair_key(r)], r) for r in variant if pair_key(r) in base]


def pair_note(n: int, what: str = "pair") -> str:
    return f"n/a ({n} {what}{'' if n == 1 else 's'})"


def ratio_interval(base_parts: list[tuple[float, float]], var_parts: list[tuple[float, float]],
                   clusters: list | None = None, confidence: float = CONFIDENCE) -> RatioInterval:
    """The ratio of the variant's sum(num)/sum(den) to the baseline's over pairs (the i-th
    part of each side is one pair), and its paired percentile bootstrap interval.
    `clusters`: each pair's problem; the pairs of one problem are resampled together
    (default: every pair on its own)."""
    import numpy as np

    n = len(base_parts)
    if n != len(var_parts) or (clusters is not None and len(clusters) != n):
        raise ValueError(f"paired ratio: {n} baseline and {len(var_parts)} variant parts")
    if n == 0:
        return RatioInterval(0, None, None, None, pair_note(0))
    units = list(dict.fromkeys(range(n) if clusters is None else clusters))
    at = {u: i for i, u in enumerate(units)}
    arrays = [np.zeros(len(units)) for _ in range(4)]  # baseline num, den; variant num, den: summed per unit
    for j, (b, v) in enumerate(zip(base_parts, var_parts)):
        i = at[j if clusters is None else clusters[j]]
        for k, x in enumerate((b[0], b[1], v[0], v[1])):
            arrays[k][i] += float(x)
    m = len(units)
    problems = None if clusters is None or m == n else m

    def statistic(bn, bd, vn, vd, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (vn.sum(axis=axis) / vd.sum(axis=axis)) / (bn.sum(axis=axis) / bd.sum(axis=axis))

    ratio = float(statistic(*arrays))
    if not np.isfinite(ratio):
        return RatioInterval(n, None, None, None, "n/a (zero baseline)", problems)
    if m < 2:
        return RatioInterval(n, ratio, None, None, pair_note(n) if n == 1 else pair_note(m, "problem"), problems)
    from scipy.stats import bootstrap

    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            res = bootstrap(arrays, statistic, paired=True, vectorized=True, confidence_level=confidence,
                            n_resamples=RESAMPLES, method="percentile", rng=np.random.default_rng(SEED))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    except (ValueError, FloatingPointError) as err:  # scipy refusing the data: say so, keep the summary
        return RatioInterval(n, ratio, None, None, f"n/a ({err})", problems)
    if not (np.isfinite(low) and np.isfinite(high)):
        return RatioInterval(n, ratio, None, None, "n/a (a zero time in some resample)", problems)
    return RatioInterval(n, ratio, low, high, None, problems)


def speed_intervals(baseline: list[dict], variant: list[dict], point: dict[str, float] | None = None
                    ) -> dict[str, RatioInterval]:
    """Per speed metric (`SPEED_PARTS`), the variant's paired ratio to the baseline with its
    95% interval, over the (problem, seed) pairs both ran, resampled by problem. `point`: the ratio table's
    ratios by metric, needed for problems/min (its interval is scaled onto the wall-time
    ratio there; without it the latency-based ratio and interval are kept)."""
    pairs = pairs_of(baseline, variant)
    out = {}
    for key, part in SPEED_PARTS.items():
        try:
            parts = [(part(b["metrics"]), part(v["metrics"])) for b, v in pairs]
        except (KeyError, TypeError):  # a record from before the metric was recorded
            out[key] = RatioInterval(len(pairs), None, None, None, "n/a (not in the records)")
            continue
        ci = ratio_interval([b for b, _ in parts], [v for _, v in parts], [v["problem_id"] for _, v in pairs])
        wall = (point or {}).get(key)
        if key in WALL_SCALED and wall and ci.ratio:
            scale = wall / ci.ratio
            ci = RatioInterval(ci.n_pairs, wall, None if ci.low is None else ci.low * scale,
                               None if ci.high is None else ci.high * scale, ci.note, ci.n_problems)
        out[key] = ci
    return out
