"""The memory-pressure sweep in `tts report` (`--config-name=pressure`): each variant's goodput
gain over its run's first variant (the paper's vLLM baseline) against the KV budget as a
share of the search's working set (`memory.working_set_fraction`), FlashTTS's Fig. 17
(right) in shape, with the paper's two stated points beside ours; and the table of every
cell's gains, intervals and block-pool counts.

The paper gives P +58% and M+P +145% goodput at 1.5 GB of KV cache (1.5B+1.5B: Qwen2.5-Math-1.5B
with a 1.5B PRM, bf16, 28,672 KV bytes per token each) and says the gains "diminish" at 14 GB,
without a number. It does not say the n of that figure; 1.5 GB is 0.185 of the working set at
n=64, 0.046 at n=256 and 0.023 at n=512 (paths of 2,048 tokens, `working_set_bytes`), so its
points are drawn across that span.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tts.markdown import markdown_table, number
from tts.report.sources import RunData, variant_ratios
from tts.report.tables import ratio_cell

# (label, goodput gain, working-set fractions of 1.5 GB at n=512 and n=64) from the paper's Sec. 6.4.4
PAPER_POINTS = [("paper P", 0.58, 0.023, 0.185), ("paper M+P", 1.45, 0.023, 0.185)]
GAINS = (("precise_goodput", "goodput"), ("problems_per_min", "problems/min"))


def pressure_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per variant of every run with `memory.working_set_fraction` set: its n,
    fraction and KV budget, its gains over the run's first variant with their paired
    intervals, and its block-pool counts. Empty when no run is a pressure cell."""
    rows = []
    for run in runs:
        memory = run.config.get("memory") or {}
        fraction = memory.get("working_set_fraction")
        if fraction is None or not run.variants:
            continue
        names = list(run.variants)
        base = names[0]
        for name in names:
            s = run.variants[name]
            row = {"run": run.name, "n": (run.config.get("search") or {}).get("n"), "fraction": float(fraction),
                   "path_tokens": (run.config.get("generator") or {}).get("max_total_tokens"), "where": _where(run),
                   "kv_cache_gib": memory.get("kv_cache_gib"), "variant": name, "baseline": base}
            for key in ("gen_thrash_share", "gen_thrash_blocks", "gen_evictions", "gen_preemptions",
                        "ver_thrash_share", "ver_thrash_blocks", "ver_evictions", "gen_cache_hit_rate",
                        "ver_cache_hit_rate"):
                row[key] = s.get(key)
            if name != base:
                row.update(variant_ratios(run, base, name, [k for k, _ in GAINS]))
            rows.append(row)
    return rows


def _where(run: RunData) -> str:
    """"simulated <device>" for a replay (`tts replay`), else "measured"."""
    host = run.host or {}
    return f"simulated {(host.get('device') or {}).get('name', '')}".strip() if host.get("simulated") else "measured"


def pressure_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table: one line per cell and variant."""
    head = ["where", "n", "path tokens", "budget / working set", "KV GiB", "variant", "goodput / baseline [95%]", "problems/min / baseline [95%]",
            "gen thrash / prefill", "gen thrash blocks", "gen evicted", "gen preempted", "ver thrash / prefill",
            "ver thrash blocks", "gen hit rate", "ver hit rate"]
    order = sorted(rows, key=lambda r: (r["where"], r["n"] or 0, r["path_tokens"] or 0, r["fraction"], r["run"],
                                        r["variant"] != r["baseline"]))
    return markdown_table(head, ([r["where"], r["n"], r["path_tokens"], number(r["fraction"], "{:.3g}"),
                                  number(r["kv_cache_gib"], "{:.3g}"), r["variant"],
                                  *(ratio_cell(r, k) for k, _ in GAINS),
                                  number(r["gen_thrash_share"], "{:.1%}"), r["gen_thrash_blocks"], r["gen_evictions"],
                                  r["gen_preemptions"], number(r["ver_thrash_share"], "{:.1%}"),
                                  r["ver_thrash_blocks"], number(r["gen_cache_hit_rate"], "{:.3f}"),
                                  number(r["ver_cache_hit_rate"], "{:.3f}")] for r in order))


def plot_pressure(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Goodput gain (%) of each variant over its run's baseline against the budget's share of
    the working set (log axis), with the 95% intervals, one line per variant and n; the
    paper's points as bars across the fractions its 1.5 GB spans. None without a gain."""
    from tts.plotting import pyplot, save_figure

    series: dict[tuple[str, Any], list[dict]] = {}
    for r in rows:
        if r.get("precise_goodput") is not None:
            series.setdefault((r["variant"], r["n"], r["where"]), []).append(r)
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (variant, n, where), points in sorted(series.items(), key=lambda kv: (kv[0][2], str(kv[0][0]), kv[0][1] or 0)):
        points.sort(key=lambda r: r["fraction"])
        xs = [r["fraction"] for r in points]
        ys = [100 * (r["precise_goodput"] - 1) for r in points]
        err = [[100 * (r["precise_goodput"] - r["precise_goodput_ci"][0]) if r.get("precise_goodput_ci") else 0
                for r in points],
               [100 * (r["precise_goodput_ci"][1] - r["precise_goodput"]) if r.get("precise_goodput_ci") else 0
                for r in points]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{variant} (n={n}, {where})",
                    linestyle="--" if where != "measured" else "-")
    for label, gain, low, high in PAPER_POINTS:
        ax.errorbar([(low * high) ** 0.5], [100 * gain], xerr=[[(low * high) ** 0.5 - low], [high - (low * high) ** 0.5]],
                    fmt="s", color="grey", alpha=0.6, capsize=3)
        ax.annotate(f"{label} at 1.5 GB (n=64 to 512)", ((low * high) ** 0.5, 100 * gain), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("KV budget / search's working set")
    ax.set_ylabel("goodput gain over the baseline (%)")
    ax.set_title("Goodput gain under memory pressure (95% intervals)", fontsize=10)
    ax.legend(fontsize=7)
    return save_figure(fig, path)
