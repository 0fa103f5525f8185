"""The ratio table: each metric of every variant against the run's first variant, with
the speed ratios' paired intervals (`tts.results.intervals`) and the accuracy rows (each
variant's interval, its paired difference and McNemar p). A number field holds a number or
null; where there is none, `<variant>_note` says why and the Markdown table prints it.
`ratio` is the one quotient of two values (None unless both are numbers) that the summary,
the report and the replay take."""

from __future__ import annotations

from tts.markdown import is_number, markdown_table, number
from tts.results.host_time import HOST_ROWS
from tts.results.pool_counts import POOL_ROWS

# (summary key, label, higher is better)
RATIO_METRICS = [
    ("precise_goodput", "precise goodput (tok/s)", True),
    ("latency_s_mean", "completion latency (s)", False),
    ("generator_s_mean", "generator time (s)", False),
    ("verifier_s_mean", "verifier time (s)", False),
    ("tokens_per_s", "throughput (tok/s)", True),
    ("problems_per_min", "problems/min", True),
    ("problems_per_min_wall", "problems/min over the wall time (tails in)", True),
    ("problems_per_min_busy", "problems/min while every slot was busy (cross-check)", True),
    ("total_gen_tokens", "generated tokens", False),
    ("gen_late_tokens", "late tokens: computed past a stop, thrown away (overlap's price, one a stopped request)",
     False),
    ("acc_majority", "accuracy (majority)", True),
    ("acc_weighted", "accuracy (weighted)", True),
    ("acc_prm_max", "accuracy (PRM-max)", True),
    ("pass@n", "pass@N", True),
    ("gen_cache_hit_rate", "generator prefix-cache hit rate", True),
    ("ver_cache_hit_rate", "verifier prefix-cache hit rate", True),
    *POOL_ROWS,
    ("gen_bound_s_mean", "generator time lower bound, same work (s)", False),
    ("latency_bound_s_mean", "completion latency lower bound, same work (s)", False),
    ("bound_share", "latency bound / latency (1: nothing left to schedule)", True),
    ("tree_bound_share", "latency bound of the tree's work (unadopted speculation out) / latency", True),
    ("problems_per_min_bound", "problems/min ceiling, same work", True),
    ("tree_problems_per_min_bound", "problems/min ceiling of the tree's work (unadopted speculation out)", True),
    ("gen_phase_tok_s", "generator phase tok/s (every token decoded, speculative included, / generator time)", True),
    ("gen_phase_vs_raw", "generator phase / raw vLLM at the sequences in flight", True),
    ("goodput_vs_ceiling", "precise goodput / one sequence's raw decode rate (about a path's best)", True),
    ("gen_batch_util_mean", "generator batch utilisation (requests per step / its own batch cap)", True),
    ("gen_batch_cap", "generator batch cap (the most requests a step may run)", True),
    ("gen_running_mean", "generator requests per step", True),
    ("step_tokens_mean", "step tokens (mean)", True),
    ("step_tokens_max_mean", "step tokens (max per iteration)", False),
    ("straggler_gap", "straggler gap (max / mean step)", False),
    ("iterations_mean", "iterations per problem", False),
    ("spec_hit_rate", "speculation hit rate", True),
    ("lookahead_hit_rate", "lookahead hit rate (scores used / scored ahead)", True),
    ("same_candidates", "final candidates = baseline's (share of problems)", True),
    ("identical_candidates_mean", "final candidates identical to another (per problem)", False),
    ("unique_answers_mean", "distinct answers among the final candidates (per problem)", True),
    ("above_bound_s", "wall time above the bound (s), of which:", False),
    ("above_host_s", "- host, outside any model step (Python, tokenizer, selection) (s)", False),
    ("above_gen_steps_s", "- generator steps beyond the fewest (stragglers, barriers) (s)", False),
    ("above_ver_steps_s", "- verifier steps beyond the fewest (more calls than its tokens need) (s)", False),
    ("above_recomputed_s", "- tokens computed beyond the work (preemption, repeated prefill) (s)", False),
    ("above_residual_s", "- step time the cost model does not explain (s)", False),
    *HOST_ROWS,
    ("spec_wasted_s", "wasted speculative tokens, inside the bound (s)", False),
    ("tail_s", "tails (one a chunk or seed): fewer problems in flight than bench.concurrency (s)", False),
    ("tail_forfeit_s", "the tails' empty share, left out of problems/min and tok/s (s)", False),
]


ACCURACY_LABELS = {"acc_majority": "majority", "acc_weighted": "weighted", "acc_prm_max": "PRM-max",
                   "pass@n": "pass@N"}


def accuracy_rows(summaries: dict[str, dict], baseline: str) -> list[dict]:
    """Text rows: each variant's accuracy with its 95% interval, and each variant's paired
    difference against the first variant of its own run (`paired`, see
    `tts.results.records.paired_accuracy`) with its interval and McNemar p-value."""
    rows = []
    for key, label in ACCURACY_LABELS.items():
        if not any(f"{key}_ci" in s for s in summaries.values()):
            continue
        row = {"metric": f"accuracy ({label}), 95% interval", "higher_is_better": True}
        for name, s in summaries.items():
            ci = s.get(f"{key}_ci")
            row[name] = f"{s[key]:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] of {s.get('num_graded', '?')}" if ci else None
        rows.append(row)
    for key, label in ACCURACY_LABELS.items():
        if not any(key in (s.get("paired") or {}) for s in summaries.values()):
            continue
        row = {"metric": f"accuracy ({label}): paired difference vs the run's first variant, 95% interval, "
                         "exact McNemar p; the difference 80% power detects", "higher_is_better": True}
        for name, s in summaries.items():
            p = (s.get("paired") or {}).get(key)
            ci = (f"[{p['diff_low']:+.3f}, {p['diff_high']:+.3f}]" if p and p.get("diff_low") is not None
                  else f"n/a ({p['n']} pair{'' if p['n'] == 1 else 's'})" if p else "")
            seen = f"; detectable ±{p['detectable']:.3f}" if p and p.get("detectable") is not None else ""
            row[name] = (f"{p['diff']:+.3f} {ci}, "
                         f"{p['only_variant']}:{p['only_baseline']} discordant, p={p['mcnemar_p']:.3g}{seen}") if p else None
        rows.append(row)
    return rows


STATISTICS_ERRORS: list[str] = []  # what `guarded` caught while the summary was built


def guarded(what: str, fn, *args):
    """`fn(*args)`, or None where it raises: a statistic that fails on some data (scipy
    refusing a sample, a record without a field) costs the run that statistic, never its
    summary. The error is logged and listed in the summary (`statistics_errors`)."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - deliberately broad: the summary must be written
        import logging

        logging.getLogger(__name__).warning("%s: not computed (%s: %s)", what, type(err).__name__, err)
        STATISTICS_ERRORS.append(f"{what}: {type(err).__name__}: {err}")
        return None


# a share of each variant's own batch cap, and the summary key of that cap
OWN_CAP = {"gen_batch_util_mean": "gen_batch_cap"}
PAIRS_LABEL = "(problem, seed) pairs behind the 95% intervals (bootstrap over problems)"


def ratio_table(summaries: dict[str, dict], baseline: str, records: dict[str, list[dict]] | None = None
                ) -> list[dict]:
    """One row per metric: each variant's value and its ratio to the baseline's; then the
    accuracy intervals and paired tests (`accuracy_rows`). With the variants' `records`
    (by name; a variant without records gets none), each speed ratio carries its paired
    95% interval (`tts.results.intervals`): `"<v>/<baseline>_ci": [low, high]`, or None
    with `"<v>/<baseline>_ci_note"` saying why ("n/a (1 pair)"), and the row's `n_pairs`
    and `n_problems` (the units resampled) by variant; a first row counts the pairs."""
    base = summaries[baseline]
    rows = []
    for key, label, higher in RATIO_METRICS:
        if key not in base:
            continue
        row = {"metric": label, "key": key, "higher_is_better": higher}
        for name, s in summaries.items():
            value = s.get(key)
            # no number, and why beside it (`<variant>_note`; the Markdown table prints it):
            # a cell of a number field holds a number or null
            note = s.get("bound_fit_note") if key in ("bound_share", "tree_bound_share") else None
            note = note or (s.get(f"{key}_note") if value is None else None)
            if note:  # no bound (the cost model does not fit the run), or no such number
                value, row[f"{name}_note"] = None, note
            row[name] = value
            quotient = ratio(value, base.get(key))
            if name != baseline and quotient is not None:
                row[f"{name}/{baseline}"] = quotient
        if key in OWN_CAP:
            _no_ratio_across_caps(row, summaries, baseline, OWN_CAP[key])
        rows.append(row)
    pairs = guarded("speed intervals", _add_intervals, rows, summaries, baseline, records or {})
    return ([pairs] if pairs else []) + rows + accuracy_rows(summaries, baseline)


def _no_ratio_across_caps(row: dict, summaries: dict[str, dict], baseline: str, cap_key: str) -> None:
    """A utilisation is a share of the variant's own batch cap: two variants under different
    caps (the memory split sizes each one's) compare by requests per step, not by this ratio."""
    base = summaries[baseline].get(cap_key)
    for name, s in summaries.items():
        col = f"{name}/{baseline}"
        if name != baseline and s.get(cap_key) != base:
            row.pop(col, None)
            row[f"{col}_note"] = f"n/a (caps {s.get(cap_key)} and {base}: see requests per step)"


def _add_intervals(rows: list[dict], summaries: dict[str, dict], baseline: str,
                   records: dict[str, list[dict]]) -> dict | None:
    """The speed rows' intervals (`ratio_table`); the row counting the pairs, None without
    records."""
    from tts.results.intervals import SPEED_PARTS, speed_intervals

    if baseline not in records:
        return None
    by_key = {row["key"]: row for row in rows if "key" in row}
    pairs = {"metric": PAIRS_LABEL, "higher_is_better": None}
    for name in summaries:
        if name == baseline or name not in records:
            continue
        col = f"{name}/{baseline}"
        point = {key: row[col] for key, row in by_key.items() if key in SPEED_PARTS and col in row}
        for key, ci in speed_intervals(records[baseline], records[name], point).items():
            row = by_key.get(key)
            if row is None or col not in row:
                continue
            row[f"{col}_ci"] = ci.bounds
            if ci.bounds is None:
                row[f"{col}_ci_note"] = ci.text()
            row.setdefault("n_pairs", {})[name] = ci.n_pairs
            row.setdefault("n_problems", {})[name] = ci.n_problems or ci.n_pairs
            # a cell: the pairs, and the problems resampled where seeds make them fewer
            pairs[col] = ci.n_pairs if ci.n_problems is None else f"{ci.n_pairs} ({ci.n_problems} problems)"
    return pairs if len(pairs) > 2 else None


def format_table(rows: list[dict], names: list[str], baseline: str) -> str:
    """A Markdown table of values and ratios; a ratio with its interval reads
    "1.23 [1.05, 1.41]", one without "1.23 n/a (1 pair)"."""
    cols = names + [f"{n}/{baseline}" for n in names if n != baseline]

    def cells(row: dict) -> list[str]:
        return [row.get(f"{c}_note") or number(row.get(c)) + _interval_text(row, c) for c in cols]

    return markdown_table(["metric", *cols], ([row["metric"], *cells(row)] for row in rows))


def _interval_text(row: dict, col: str) -> str:
    if f"{col}_ci" not in row or row.get(col) is None:
        return ""
    ci = row[f"{col}_ci"]
    return f" [{number(float(ci[0]))}, {number(float(ci[1]))}]" if ci else f" {row.get(f'{col}_ci_note') or 'n/a'}"


def ratio(a, b) -> float | None:
    """a / b where both are numbers (`tts.markdown.is_number`) and b is not 0, else None:
    every ratio of a summary, a report and a replay."""
    return a / b if is_number(a) and is_number(b) and b else None
