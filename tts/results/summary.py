"""The run summary: per-variant metrics and accuracy, ratios against the first variant
(`tts.results.ratios`), and the plots (ablation bars, batch utilisation over time,
histograms)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from tts.metrics.measures import KV_BLOCKS, summarize_problems
from tts.metrics.cost_model import (COST, CostModel, CostSums, above_bound, busy_rate, fit, tail_forfeit,
                                     work_bounds, work_of)
from tts.results.host import run_hosts
from tts.results.ratios import STATISTICS_ERRORS, format_table, guarded, ratio_table
from tts.results.records import accuracy_summary, pair_key, paired_accuracy
from tts.results.store import RunStore
from tts.results.host_time import add_host_time
from tts.results.pool_counts import add_pool_counts, add_recomputed
from tts.results.tree import describe, diversity


def variant_summary(records: list[dict], step_log: dict | None, wall_s: float | None,
                    concurrency: int = 1) -> dict:
    """Per-variant metrics. With the variant's wall time (`wall_s`, all its problems, in flight
    together or not) throughput is generated tokens and problems over that wall time; without
    it (an old run folder) over the sum of the problems' latencies, which is the same thing
    only when problems ran one at a time.

    With `concurrency` problems in flight, each pass (a chunk, a seed) ends in a tail where
    fewer are left (`tail_forfeit`): its empty slots are left out of the rates. Problems/min
    and tokens/s are over the wall time less the tails' empty share (`tail_forfeit_s`), which
    is the sum of the problems' latencies over the slots; the wall-time rates, tails in, are
    kept beside them (`problems_per_min_wall`, `tokens_per_s_wall`). A variant whose problems
    take alike finishes a pass together and a variant whose problems vary waits on its
    longest: over the wall time that difference would read as throughput."""
    s = summarize_problems([r["metrics"] for r in records])
    s.update(accuracy_summary(records))
    total = sum(r["metrics"]["latency_s"] for r in records)
    span = wall_s or total
    if wall_s:
        s["wall_s"] = wall_s
        if concurrency > 1 and all(r.get("variant_wall_s") for r in records):
            spans = [(r["variant_wall_s"] - r["metrics"]["latency_s"], r["variant_wall_s"]) for r in records]
            s["tail_s"], s["tail_forfeit_s"] = tail_forfeit(spans, concurrency)
            busy, done = busy_rate(spans, concurrency)
            if busy > 0:  # the cross-check: over the time every slot was busy
                s["problems_per_min_busy"] = 60.0 * done / busy
            if 0 < s["tail_forfeit_s"] < wall_s:
                s["problems_per_min_wall"] = 60.0 * len(records) / wall_s
                s["tokens_per_s_wall"] = s["total_gen_tokens"] / wall_s
                span = wall_s - s["tail_forfeit_s"]
        s["tokens_per_s"] = s["total_gen_tokens"] / span
    s["problems_per_min"] = 60.0 * len(records) / span if records and span else 0.0
    if step_log:
        for model, log in step_log.items():
            s[model] = log
            if model == KV_BLOCKS:  # per model, its block pool's counts
                add_pool_counts(s, log)
            if "batch_util_mean" not in log:  # not an engine's steps (M's re-plans, a schedule's counters)
                continue
            s[f"{model[:3]}_batch_util_mean"] = log["batch_util_mean"]
            s[f"{model[:3]}_running_mean"] = log.get("running_mean", 0.0)
            if cap := (log.get(COST) or {}).get("batch_cap"):  # the largest its steps ran under
                s[f"{model[:3]}_batch_cap"] = cap
            if late := log.get("late_tokens"):  # with overlap only: thrown-away tokens past a stop
                s[f"{model[:3]}_late_tokens"] = late
        add_recomputed(s, [r["metrics"] for r in records])
        phase = (step_log.get("generator") or {}).get("model_s")
        if phase and "total_gen_tokens" in s:  # absent before the variant's model time was logged
            s["gen_phase_tok_s"] = s["total_gen_tokens"] / phase
        add_host_time(s, records)
    return s


def add_raw_ratio(summary: dict, raw: dict | None) -> None:
    """The variant against raw vLLM (`bench.raw_generator`), when the run measured it: its
    generator phase against raw tok/s at the run's sequences in flight, and its precise
    goodput against one sequence's decode rate, about the best a path's tokens can come at
    (its inverse is about the most any schedule could multiply this variant's goodput by;
    a reference, not a strict bound: see `tts.benchmarks.ceiling.raw_generator`)."""
    if not raw:
        return
    if raw.get("tok_s") and summary.get("gen_phase_tok_s"):
        summary["gen_phase_vs_raw"] = summary["gen_phase_tok_s"] / raw["tok_s"]
    if raw.get("single_tok_s") and summary.get("precise_goodput"):
        summary["goodput_vs_ceiling"] = summary["precise_goodput"] / raw["single_tok_s"]


def cost_models(summaries: dict[str, dict]) -> dict[str, CostModel | None]:
    """Each model's step cost model, fitted on the steps of every variant of the run
    (`tts.metrics.cost_model`)."""
    out = {}
    for model in ("generator", "verifier"):
        sums = [CostSums.from_dict(s[model][COST]) for s in summaries.values()
                if COST in (s.get(model) or {})]
        out[model] = fit(sum(sums, CostSums())) if sums else None
    return out


def add_bounds(summary: dict, records: list[dict], models: dict[str, CostModel | None],
               concurrency: int = 1) -> None:
    """The variant's lower bounds under the run's cost models: per problem on its own, their
    means and the share of the measured latency they are; and for the whole variant, with
    `concurrency` problems in flight at most, the least wall time and so the most
    problems/min its work allows."""
    caps = {}
    for model in ("generator", "verifier"):
        sums = CostSums.from_dict((summary.get(model) or {}).get(COST, {}))
        caps[model] = (sums.batch_cap, sums.token_cap)
    gen, ver = models.get("generator"), models.get("verifier")
    metrics = [r["metrics"] for r in records]
    per = [work_bounds([m], gen, ver, caps["generator"], caps["verifier"]) for m in metrics]
    if not per or any(b["gen_bound_s"] is None or b["ver_bound_s"] is None for b in per):
        return
    summary["gen_bound_s_mean"] = statistics.fmean(b["gen_bound_s"] for b in per)
    summary["ver_bound_s_mean"] = statistics.fmean(b["ver_bound_s"] for b in per)
    summary["latency_bound_s_mean"] = summary["gen_bound_s_mean"] + summary["ver_bound_s_mean"]
    tree = [work_bounds([m], gen, ver, caps["generator"], caps["verifier"], tree_only=True) for m in metrics]
    summary["tree_bound_s_mean"] = statistics.fmean(b["gen_bound_s"] + b["ver_bound_s"] for b in tree)
    if summary.get("latency_s_mean"):
        summary["bound_share"] = summary["latency_bound_s_mean"] / summary["latency_s_mean"]
        summary["tree_bound_share"] = summary["tree_bound_s_mean"] / summary["latency_s_mean"]
        if summary["bound_share"] > 1.0:  # measured faster than its "least" time: the fit is wrong here
            fits = ", ".join(f"{m} r2 {cm.r2:.2f}" for m, cm in models.items() if cm is not None)
            note = (f"the cost model does not fit this run ({fits}; its bound is "
                    f"{summary['latency_bound_s_mean'] - summary['latency_s_mean']:.3g} s above the measured latency)")
            summary["bound_fit_note"] = note  # the ratio table shows it in place of the shares
    whole = work_bounds(metrics, gen, ver, caps["generator"], caps["verifier"], concurrency)
    summary["wall_bound_s"] = whole["gen_bound_s"] + whole["ver_bound_s"]
    if summary["wall_bound_s"] > 0:
        summary["problems_per_min_bound"] = 60.0 * len(records) / summary["wall_bound_s"]
    tree_whole = work_bounds(metrics, gen, ver, caps["generator"], caps["verifier"], concurrency, tree_only=True)
    if (tree_wall := tree_whole["gen_bound_s"] + tree_whole["ver_bound_s"]) > 0:
        summary["tree_problems_per_min_bound"] = 60.0 * len(records) / tree_wall
    wall = summary.get("wall_s") or sum(m["latency_s"] for m in metrics)
    sums = {model: CostSums.from_dict((summary.get(model) or {}).get(COST, {})) for model in ("generator", "verifier")}
    parts = above_bound(wall, work_of(metrics, caps["generator"], caps["verifier"], concurrency), models, sums)
    if parts is not None:  # where the wall time above the bound went (`above_bound`)
        summary["above_bound_s"] = wall - summary["wall_bound_s"]
        summary.update({f"above_{k}": v for k, v in parts.items()})
    if gen is not None:  # inside the bound, but bought nothing
        summary["spec_wasted_s"] = gen.per_decode_seq_s * summary.get("spec_wasted", 0)


NOT_CACHED = "not cached (vLLM)"


def _mark_uncached_verifier(summaries: dict[str, dict], config: dict) -> None:
    """A verifier whose requests vLLM cannot serve from the prefix cache (prompt log-probs:
    Math-Shepherd) has no hit rate: null, with a note that says why (`<key>_note`, which the
    tables print in its place) instead of a 0 that reads as a cold cache."""
    from tts.backends.adapters import ADAPTERS

    verifier = config.get("verifier") or {}
    adapter = ADAPTERS.get(str(verifier.get("adapter")))
    if verifier.get("backend", "vllm") != "vllm" or adapter is None or adapter.reads_prefix_cache:
        return
    for summary in summaries.values():
        summary["ver_cache_hit_rate"], summary["ver_cache_hit_rate_note"] = None, NOT_CACHED


def same_candidates(records: list[dict], baseline: str, variant: str) -> float | None:
    """The share of the (problem, seed) pairs both variants ran whose final candidates (their texts, in
    any order) are the baseline's: 1.0 where the variant kept the search's results, as
    the FlashTTS switches should up to the numerics of other batches. None: no problem
    in common."""
    def texts(name: str) -> dict[tuple, list[str]]:
        return {pair_key(r): sorted(c["text"] for c in r["candidates"])
                for r in records if r.get("variant") == name}

    base, mine = texts(baseline), texts(variant)
    common = base.keys() & mine.keys()
    return sum(base[p] == mine[p] for p in common) / len(common) if common else None


def variant_wall(records: list[dict], variant: str) -> float:
    """Wall seconds the variant had run when its last record was written (0: none yet)."""
    return max((r.get("variant_wall_s") or 0.0 for r in records if r.get("variant") == variant), default=0.0)


def _compare(summary: dict, records: list[dict], by_variant: dict[str, list[dict]]) -> None:
    """Every variant against the first: the share of like final candidates, the paired
    accuracy differences, and the ratio table with its intervals."""
    summaries, names = summary["variants"], list(by_variant)
    for name in names:
        summaries[name]["same_candidates"] = same_candidates(records, names[0], name)
        if name != names[0]:
            summaries[name]["paired"] = guarded("paired accuracy", paired_accuracy, by_variant[names[0]],
                                                by_variant[name]) or {}
    summary["ratios"] = ratio_table(summaries, names[0], by_variant)
    summary["ratio_table_md"] = format_table(summary["ratios"], names, names[0])


def write_summary(store: RunStore, names: list[str], step_logs: dict[str, dict], host: dict | None = None,
                  pending: list[str] | None = None, plots: bool = True,
                  extra: dict | None = None) -> tuple[dict, list[Path]]:
    """Summarise the run's records per variant, write summary.json and the plots. A variant's
    wall time is the largest `variant_wall_s` of its records (see `variant_summary`). Speed
    ratios get paired intervals over the (problem, seed) pairs (`ratio_table`); a ratio
    without one (too few pairs) says so, and the summary is written whatever the pairs. `host`
    is where the run ran (`tts.results.host.host_info`); None keeps the one recorded before
    (re-grading runs nothing). `pending`: the variants a run still has to run (a summary
    written as each variant ends; None keeps the earlier list, less `names`); `plots` False
    leaves the plots to the run's last summary; `extra`: more top-level entries (a merge's shards)."""
    STATISTICS_ERRORS.clear()
    seed = int((store.saved_config().get("bench") or {}).get("seed") or 0)
    # a record from before records carried their seed ran under the run's bench.seed
    records = [r if "seed" in r else {**r, "seed": seed} for r in store.records()]
    previous = {}
    try:
        previous = store.summary()
    except (FileNotFoundError, ValueError):
        pass
    old = previous.get("variants", {})
    concurrency = int((store.saved_config().get("bench") or {}).get("concurrency") or 1)
    by_variant = {name: [r for r in records if r.get("variant", "") == name] for name in names}
    summaries = {}
    for name, mine in by_variant.items():
        log = step_logs.get(name) or {k: v for k, v in old.get(name, {}).items() if k in ("generator", "verifier", KV_BLOCKS)}
        summaries[name] = variant_summary(mine, log or None, variant_wall(mine, name) or None,
                                          concurrency) | diversity(mine)
    models = cost_models(summaries)  # on every variant's steps: bounds need them all first
    raw = store.raw_generator()
    for name, mine in by_variant.items():
        add_bounds(summaries[name], mine, models, concurrency)
        add_raw_ratio(summaries[name], raw)
    _mark_uncached_verifier(summaries, store.saved_config())
    skipped = store.skipped()  # problems left out: their prompts do not fit the engines
    summary = {"host": host or previous.get("host"), "hosts": run_hosts(records), "variants": summaries,
               "baseline": names[0], "cost_model": {m: (asdict(cm) if cm else None) for m, cm in models.items()},
               "num_skipped": len(skipped), "skipped": skipped,
               "seeds": sorted({r["seed"] for r in records}),
               "pending": [p for p in (previous.get("pending", []) if pending is None else pending) if p not in names]}
    if raw:
        summary["raw_generator"] = raw
    if len(names) > 1:
        _compare(summary, records, by_variant)
    summary.update(extra or {})  # what the caller adds (`tts merge`: the shards)
    guarded("tree and verifier", describe, summary, by_variant, store.saved_config(), store.trace)
    if STATISTICS_ERRORS:
        summary["statistics_errors"] = STATISTICS_ERRORS.copy()
        STATISTICS_ERRORS.clear()
    store.write_summary(summary)
    from tts.results.headline import write_summary_markdown

    write_summary_markdown(store.path, summary)
    from tts.results.plots import make_plots
    return summary, (make_plots(store, summary, step_logs) if plots else [])
