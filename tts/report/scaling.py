"""The scaling sweep in `tts report` (`--config-name=paper_sweep`): each variant's goodput,
latency and problems/min against its run's first variant (the paper's vLLM baseline) at
every search.n, measured and simulated (`tts replay` of the sweep's jobs on another device,
other models, either price of a step), beside FlashTTS's Fig. 12; and where the time went
at each n (straggler gap, both models' batch utilisation and time, the block pools'
evictions, thrash, preemptions and recomputed prefill, the latency bound and the variant's
share of it); beside a replayed row, the shares of the variant's tokens and scores that its
trace did not hold, so the replay drew them. `tts.report.ablation` takes the gain apart (the
tree against the schedule, one optimisation at a time).

The runs taken are those with two variants or more, the same variant set, and at least two
values of search.n among them (a memory-pressure cell, `memory.working_set_fraction`, is the
pressure section's). The ratios and their paired 95% intervals are the runs' own
(summary.json's `ratios`, over the same problems and seeds); a run without them (a W&B
run, an old folder) gets them from its records, as its summary would.

The paper's Fig. 12 gives FlashTTS's goodput over vLLM on a 24 GB GPU (RTX 4090) for its
three model pairs at n = 8 to 512: 2.2x on average, 1.2x to 5.4x.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tts.markdown import is_number, markdown_table, number
from tts.report.sources import RunData, variant_ratios
from tts.report.tables import ratio_cell

PAPER_MEAN, PAPER_LOW, PAPER_HIGH = 2.2, 1.2, 5.4
PAPER_LABEL = "FlashTTS Fig. 12 (24 GB GPU): mean 2.2x, range 1.2-5.4x"
PLOT = Path("plots") / "ratio_by_n.png"
# (summary key, column label): the ratios to the run's first variant, with their intervals
RATIOS = (("precise_goodput", "goodput"), ("latency_s_mean", "latency"), ("problems_per_min", "problems/min"))
# (summary key, column label, format): where the time goes, each variant's own
WHERE = (("straggler_gap", "straggler gap", "{:.2f}"), ("gen_batch_util_mean", "gen batch util", "{:.2f}"),
         ("ver_batch_util_mean", "ver batch util", "{:.2f}"), ("generator_s_mean", "gen time (s)", "{:.3g}"),
         ("verifier_s_mean", "ver time (s)", "{:.3g}"), ("gen_evictions", "gen evicted", "{}"),
         ("gen_thrash_blocks", "gen thrash blocks", "{}"), ("gen_preemptions", "gen preempted", "{}"),
         ("gen_recomputed_tokens", "gen recomputed tokens", "{}"),
         ("ver_evictions", "ver evicted", "{}"), ("ver_thrash_blocks", "ver thrash blocks", "{}"),
         ("latency_bound_s_mean", "latency bound (s)", "{:.3g}"), ("bound_share", "bound / latency", "{:.2f}"))
# (row key, column label): a replayed variant's shares of its tokens and scores that its trace
# did not hold, so were drawn (`RunData.drawn_shares`); none on a measured row
DRAWN = (("drawn_token_share", "drawn tokens"), ("drawn_score_share", "drawn scores"))
# a simulated cell drawing more than this share of its tokens or scores rests on drawn
# tokens, not on the recorded tree: its table cell says so (issue 67: only cells at or
# under it count toward an answer)
DRAWN_LIMIT = 0.05


def scaling_runs(runs: list[RunData]) -> list[RunData]:
    """The runs of a scaling sweep: two variants or more, search.n known, not a pressure
    cell, and sharing their variant set with runs at another n. Empty when there is none."""
    groups: dict[tuple[str, ...], list[RunData]] = {}
    for run in runs:
        if len(run.variants) > 1 and search_n(run) is not None and \
                (run.config.get("memory") or {}).get("working_set_fraction") is None:
            groups.setdefault(tuple(run.variants), []).append(run)
    return [run for group in groups.values() if len({search_n(r) for r in group}) > 1 for run in group]


def search_n(run: RunData) -> int | None:
    """The run's search.n, or None where its config does not hold a whole number."""
    value = (run.config.get("search") or {}).get("n")
    return value if isinstance(value, int) else None


def source_of(run: RunData) -> dict[str, Any]:
    """Where the run's numbers come from: measured on its host, or simulated (`tts replay`)
    on a device for a model pair at a step price (`replay.step_costs`, or "fitted" where a
    fitted step cost priced it), with a label for the table and the plot."""
    host = run.host or {}
    if not host.get("simulated"):
        where = host.get("gpu") or host.get("cpu_model") or "an unrecorded host"
        return {"simulated": False, "label": f"measured on {where}"}
    device = (host.get("device") or {}).get("name") or "?"
    pair = "+".join(Path(str(m)).name for m in (host.get("models") or {}).values()) or "?"
    cost = host.get("cost")
    price = (host.get("options") or {}).get("step_costs") if cost == "roofline" else cost
    price = price or "unrecorded"
    tree = (host.get("options") or {}).get("tree")  # replay.tree: every variant served that variant's tree
    return {"simulated": True, "device": device, "pair": pair, "price": price, "tree": tree,
            "label": f"simulated on {device} {pair} ({price} prices)" + (f", on {tree}'s tree" if tree else "")}


def tree_basis(run: RunData) -> str:
    """Whether a run's variants grew one tree, so a ratio between them is the schedule's
    alone: a replay served one variant's recording (`replay.tree`); or the trees were grown
    in float32 with the position sampler, one unless a batch's rounding parts them
    (docs/results.md, "Trees move with numerics"; conf/paper_fig12.yaml); otherwise each
    variant grew its own, and a split between tree and schedule is approximate."""
    host = run.host or {}
    tree = source_of(run).get("tree")
    if tree:
        return f"one: {tree}'s (replay.tree)"
    grown = host.get("recorded_on") if host.get("simulated") else host
    grown = grown if isinstance(grown, dict) else {}
    dtypes = set((grown.get("dtype") or {}).values())
    sampler = grown.get("sampler")
    if dtypes == {"float32"} and sampler == "position":
        return "one unless rounding parts them (float32, position sampler)"
    return f"each its own ({'/'.join(sorted(dtypes)) or 'dtype unrecorded'}, {sampler or 'unrecorded'} sampler)"


def run_line(run: RunData) -> dict[str, Any]:
    """What every line of a run of the sweep starts with: the run, its n, its source
    (`source_of`) and its first variant, the baseline of its ratios."""
    source = source_of(run)
    return {"run": run.name, "n": search_n(run), "source": source["label"], "simulated": source["simulated"],
            "device": source.get("device"), "pair": source.get("pair"), "price": source.get("price"),
            "tree": source.get("tree"), "baseline": next(iter(run.variants))}


def scaling_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per variant of each run of the sweep (`scaling_runs`): its n and source, its
    ratios to the run's first variant with their paired 95% intervals (the first variant's
    row has none), and where its time went. Empty when the runs are no scaling sweep."""
    rows = []
    for run in scaling_runs(runs):
        line = run_line(run)
        base = line["baseline"]
        for name, s in run.variants.items():
            row = {**line, "variant": name}
            if name != base:
                row.update(variant_ratios(run, base, name, [k for k, _ in RATIOS]))
            row.update(zip((k for k, _ in DRAWN), run.drawn_shares(name)))
            for key, _, _ in WHERE:
                value = s.get(key)
                row[key] = None if key == "bound_share" and s.get("bound_fit_note") else value
            rows.append(row)
    return rows


def _order(row: dict[str, Any]) -> tuple:
    """By n, measured before simulated, by source, the first variant first."""
    return row["n"], row["simulated"], row["source"], row["run"], row["variant"] != row["baseline"]


def scaling_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table: one line per n, source and variant."""
    head = ["n", "source", "variant", *(f"{label} / baseline [95%]" for _, label in RATIOS), "pairs",
            *(label for _, label in DRAWN), *(label for _, label, _ in WHERE)]
    return markdown_table(head, ([r["n"], r["source"], r["variant"], *(ratio_cell(r, k) for k, _ in RATIOS),
                                  None if r["variant"] == r["baseline"] else r.get("pairs"),
                                  *(drawn_cell(r.get(key)) for key, _ in DRAWN),
                                  *(number(r.get(key), spec) for key, _, spec in WHERE)]
                                 for r in sorted(rows, key=_order)))


def drawn_cell(share: float | None) -> str:
    """A drawn share as a table prints it: "0.0%", "12.3% (over 5%)" past `DRAWN_LIMIT`, "-"
    on a measured row."""
    if not is_number(share):
        return "-"
    return f"{share:.1%}" + (f" (over {DRAWN_LIMIT:.0%})" if share > DRAWN_LIMIT else "")


def over_drawn(row: dict[str, Any]) -> bool:
    """Whether a simulated cell drew more than `DRAWN_LIMIT` of its tokens or scores: shown,
    marked (a hollow marker on the plot), and left out of an answer."""
    return any(is_number(row.get(key)) and row[key] > DRAWN_LIMIT for key, _ in DRAWN)


def scaling_section(rows: list[dict[str, Any]], plot: Path | None, parts: list[str] = ()) -> list[str]:
    """The report's lines for the sweep: what the table holds, the table, `parts` (the gain
    taken apart, `tts.report.ablation`), the plot."""
    simulated = any(r["simulated"] for r in rows)
    return ["## Scaling with n", "",
            "Each variant against its run's first (the baseline) at each search.n, over the run's problems and "
            "seeds (paired 95% intervals, resampled by problem); the other columns are each variant's own. "
            + ("Rows whose source says simulated come from `tts replay` (a simulated clock), not a measurement; "
               "their drawn tokens and scores are the shares of the variant's own the trace did not hold, so the "
               f"replay drew them: a cell over {DRAWN_LIMIT:.0%} rests on drawn tokens, not on the recorded tree. "
               if simulated else "")
            + f"Reference: {PAPER_LABEL}.", "", scaling_table(rows), "", *parts,
            f"![Goodput ratio by n]({PLOT.as_posix()})" if plot else "_no goodput ratio to draw_", ""]


def plot_ratio_by_n(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Goodput ratio to the baseline (log2) against n (log2), one line per variant and
    source with its 95% intervals (a colour per source, a marker per variant), simulated
    lines dashed, a cell over `DRAWN_LIMIT` drawn hollow; the paper's Fig. 12 mean as a
    dashed line and its range as a band. None without a ratio to draw."""
    from tts.plotting import pyplot, save_figure

    series: dict[tuple[str, str, bool], list[dict]] = {}
    for r in rows:
        if isinstance(r.get("precise_goodput"), (int, float)) and r["precise_goodput"] > 0:
            series.setdefault((r["variant"], r["source"], r["simulated"]), []).append(r)
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2 + 0.16 * (len(series) + 1)))
    ax.axhspan(PAPER_LOW, PAPER_HIGH, color="grey", alpha=0.15, label=PAPER_LABEL)
    ax.axhline(PAPER_MEAN, color="grey", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.6)
    sources = sorted({(s, src) for _, src, s in series})  # a colour per source, a marker per variant
    colours = {src: plt.get_cmap("tab10" if len(sources) <= 10 else "tab20")(i) for i, (_, src) in enumerate(sources)}
    markers = {v: "osD^v<>p*h"[i % 10] for i, v in enumerate(dict.fromkeys(v for v, _, _ in series))}
    common, labels = legend_labels({r["source"]: r for points in series.values() for r in points})
    for (variant, source, simulated), points in sorted(series.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        points.sort(key=lambda r: r["n"])
        ys = [r["precise_goodput"] for r in points]
        cis = [r.get("precise_goodput_ci") or [y, y] for r, y in zip(points, ys)]
        err = [[max(0.0, y - ci[0]) for y, ci in zip(ys, cis)], [max(0.0, ci[1] - y) for y, ci in zip(ys, cis)]]
        ax.errorbar([r["n"] for r in points], ys, yerr=err, marker=markers[variant], capsize=3,
                    label=f"{variant}, {labels[source]}".rstrip(", "), color=colours[source],
                    linestyle="--" if simulated else "-")
        over = [(r["n"], y) for r, y in zip(points, ys) if over_drawn(r)]  # marked: hollow, on top
        if over:
            ax.scatter(*zip(*over), marker=markers[variant], s=40, facecolors="white", edgecolors=colours[source],
                       zorder=3, label=None)
    _axes(ax, sorted({r["n"] for points in series.values() for r in points}))
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, title=common or None,
              title_fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def legend_labels(rows: dict[str, dict[str, Any]]) -> tuple[str, dict[str, str]]:
    """The sources' labels for a legend (source -> a row of it), what they share said once:
    (the shared part, each source's own part). A simulated source is told by its device,
    pair, price and tree; a measured one by its label."""
    def parts(row: dict[str, Any]) -> tuple[str, ...]:
        if not row["simulated"]:
            return (row["source"], "", "", "")
        return (f"simulated on {row['device']}", row["pair"], f"({row['price']} prices)",
                f"on {row['tree']}'s tree" if row.get("tree") else "")
    split = {source: parts(row) for source, row in rows.items()}
    shared = [len({p[i] for p in split.values()}) == 1 for i in range(4)]
    first = next(iter(split.values()), ("",) * 4)
    return (" ".join(p for p, same in zip(first, shared) if same and p),
            {source: ", ".join(q for q, same in zip(p, shared) if not same and q) for source, p in split.items()})


def _axes(ax, ns: list[int]) -> None:
    """Both axes log2, ticked at the runs' n and at powers of two of the ratio ("2x")."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ns))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.8), max(high, PAPER_HIGH * 1.15))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.set_xlabel("n (search.n)")
    ax.set_ylabel("goodput / baseline's goodput")
    ax.set_title(f"Goodput ratio by n (95% intervals; dashed: simulated; hollow: over {DRAWN_LIMIT:.0%} drawn)",
                 fontsize=10)
    ax.grid(alpha=0.3)
