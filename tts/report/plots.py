"""The report's PNG plots (matplotlib with the Agg backend, imported lazily).

Each function writes one PNG and returns its path, or returns None when the runs hold
nothing to draw (then the report says so instead of embedding an empty figure).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tts.markdown import is_number
from tts.plotting import pyplot, save_figure
from tts.report.tables import Column, engine_label
from tts.results.plots import plot_frontier as draw_frontier

ACCURACY = [("acc_majority", "majority"), ("acc_weighted", "weighted"), ("acc_prm_max", "PRM-max"),
            ("pass@n", "pass@N")]
CACHE = [("gen_cache_hit_rate", "generator"), ("ver_cache_hit_rate", "verifier")]
SWEEP_KEYS = ("sweep", "split_sweep", "splits", "curve")
SPLIT_KEYS = ("generator_fraction", "split", "gen_fraction", "fraction")
MAX_SWEEP_PANELS = 4
MAX_BAR_LABELS = 48


def plot_by_n(path: Path, columns: list[Column]) -> Path | None:
    """Precise goodput and completion latency against search.n, one line per engine kind
    (through the mean where several columns share a kind and an N; each column a dot)."""
    lines: dict[str, list[tuple[int, float, float]]] = {}
    for c in columns:
        if c.n is None:
            continue
        kind = engine_label(c.config.get("optim") or {})
        kind = c.variant if kind == "-" else kind
        lines.setdefault(kind, []).append((c.n, _num(c.metrics, "precise_goodput"), _num(c.metrics, "latency_s_mean")))
    if not lines:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for kind, points in lines.items():
        xs = sorted({p[0] for p in points})
        for ax, k in zip(axes, (1, 2)):
            means = [statistics.fmean(p[k] for p in points if p[0] == x) for x in xs]
            line, = ax.plot(xs, means, marker="o", label=kind)
            ax.scatter([p[0] for p in points], [p[k] for p in points], s=12, color=line.get_color(), alpha=0.6)
    for ax, label, title in zip(axes, ("precise goodput (tok/s)", "completion latency (s)"),
                                ("Goodput by N", "Latency by N")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (search.n)")
        ax.set_ylabel(label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def plot_grouped(path: Path, columns: list[Column], series: list[tuple[str, str]],
                 title: str, ylabel: str) -> Path | None:
    """Grouped bars: one group per column, one bar per metric of `series` the runs report,
    each with its 95% interval as an error bar where the run gives one (`<key>_ci`)."""
    present = [(k, label) for k, label in series if any(c.metrics.get(k) is not None for c in columns)]
    if not present:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 + 0.9 * len(columns) * len(present) / 2), 3.4))
    width = 0.8 / len(present)
    for k, (key, label) in enumerate(present):
        xs = [i + (k - (len(present) - 1) / 2) * width for i in range(len(columns))]
        values = [_num(c.metrics, key) for c in columns]
        cis = [c.metrics.get(f"{key}_ci") for c in columns]  # an accuracy's 95% interval, as the table has it
        errors = [[max(0.0, v - ci[0]) if ci else 0.0 for v, ci in zip(values, cis)],
                  [max(0.0, ci[1] - v) if ci else 0.0 for v, ci in zip(values, cis)]]
        ax.bar(xs, values, width, label=label, yerr=errors if any(cis) else None, capsize=2)
        if len(columns) * len(present) <= MAX_BAR_LABELS:
            for x, v in zip(xs, values):
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([c.name for c in columns], rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_accuracy(path: Path, columns: list[Column]) -> Path | None:
    """Majority, weighted, PRM-max accuracy and pass@N, bars per column."""
    return plot_grouped(path, columns, ACCURACY, "Accuracy", "fraction of problems")


def plot_cache_hits(path: Path, columns: list[Column]) -> Path | None:
    """The generator's and the verifier's prefix-cache hit rates, bars per column."""
    return plot_grouped(path, columns, CACHE, "Prefix-cache hit rate per model", "cached / prompt tokens")


def split_sweep(profile: dict[str, Any]) -> tuple[str, list[dict[str, float]]] | None:
    """The generator/verifier split sweep of a `profile.json`: (split key, rows sorted by split).

    The sweep is a list of objects under one of ``SWEEP_KEYS`` (or a mapping from split to
    object), each holding the split (one of ``SPLIT_KEYS``) and numeric measurements.
    """
    for key in SWEEP_KEYS:
        sweep = profile.get(key)
        if isinstance(sweep, dict):
            sweep = [{"split": _float(s), **v} for s, v in sweep.items() if isinstance(v, dict)]
        if isinstance(sweep, list) and sweep and all(isinstance(r, dict) for r in sweep):
            split = next((s for s in SPLIT_KEYS if all(is_number(r.get(s)) for r in sweep)), None)
            if split is not None:
                rows = [{k: float(v) for k, v in r.items() if is_number(v)} for r in sweep]
                return split, sorted(rows, key=lambda r: r[split])
    return None


def sweep_metrics(sweeps: list[tuple[str, list[dict[str, float]]]]) -> list[str]:
    """The measurements the sweeps hold (one panel each), first seen first, at most MAX_SWEEP_PANELS."""
    keys = [k for split, rows in sweeps for r in rows for k in r if k != split and k not in SPLIT_KEYS]
    return list(dict.fromkeys(keys))[:MAX_SWEEP_PANELS]


def plot_memory_split(path: Path, profiles: dict[str, dict[str, Any]]) -> Path | None:
    """Each profiled run's measurements against the generator's share of the KV memory."""
    sweeps = {name: s for name, p in profiles.items() if (s := split_sweep(p)) is not None}
    if not sweeps:
        return None
    metrics = sweep_metrics(list(sweeps.values()))
    if not metrics:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for name, (split, rows) in sweeps.items():
            pts = [(r[split], r[metric]) for r in rows if metric in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xlabel("generator share of KV memory")
        ax.set_title(metric, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Memory split sweep")
    return save_figure(fig, path)


PlotFn = Callable[[Path, list[Column]], Path | None]
def plot_frontier(path: Path, columns: list[Column]) -> Path | None:
    """Accuracy with its interval against tokens and latency, a point per column."""
    return draw_frontier(path, {c.name: c.metrics for c in columns})


def device_ratios(columns: list[Column]) -> list[tuple[str, str, float, float]]:
    """(device, "models N=n: variant/first", goodput ratio, latency ratio) of each simulated
    run (`tts replay`) among the columns: each variant against the run's first. A roofline
    replay says which step price it ran at (`replay.step_costs`; one from before the option
    was priced at the datasheet), so the same trace replayed under both reads side by side."""
    runs: dict[int, tuple[Any, dict[str, dict], int | None]] = {}
    for c in columns:
        if (c.run.host or {}).get("simulated"):
            runs.setdefault(id(c.run), (c.run, {}, c.n))[1][c.variant] = c.metrics
    out = []
    for run, variants, n in runs.values():
        host, names = run.host, list(variants)
        models = "/".join(Path(str(m)).name for m in (host.get("models") or {}).values())
        models += f" N={n}" if n is not None else ""
        options = host.get("options") or {}
        if host.get("cost") == "roofline":
            models += f" ({options.get('step_costs', 'datasheet')} steps)"
        if options.get("speculation") == "recorded":
            models += " (speculation as recorded)"
        for name in names[1:]:
            first, mine = variants[names[0]], variants[name]
            if _num(first, "precise_goodput") and _num(first, "latency_s_mean"):
                out.append(((host.get("device") or {}).get("name", "?"), f"{models}: {name}/{names[0]}",
                            _num(mine, "precise_goodput") / _num(first, "precise_goodput"),
                            _num(mine, "latency_s_mean") / _num(first, "latency_s_mean")))
    return out


def plot_ratio_by_device(path: Path, columns: list[Column]) -> Path | None:
    """Simulated runs only: each variant's precise goodput and latency over the run's first
    variant, by device, one bar per model pair and variant."""
    points = device_ratios(columns)
    if not points:
        return None
    devices = list(dict.fromkeys(p[0] for p in points))
    series = list(dict.fromkeys(p[1] for p in points))
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4 + 0.25 * len(series)))
    width = 0.8 / len(series)
    for k, label in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(devices))]
        for ax, col in zip(axes, (2, 3)):
            values = {p[0]: p[col] for p in points if p[1] == label}
            ax.bar(xs, [values.get(d, 0.0) for d in devices], width, label=label)
    for ax, title in zip(axes, ("precise goodput ratio (SIMULATED)", "latency ratio (SIMULATED)")):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(devices)))
        ax.set_xticklabels(devices)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", fontsize=7, ncol=1)
    return save_figure(fig, path, rect=(0, 0.07 * len(series), 1, 1))


COLUMN_PLOTS: list[tuple[str, str, PlotFn]] = [
    ("goodput_latency_by_n.png", "Goodput and latency by N", plot_by_n),
    ("accuracy.png", "Accuracy", plot_accuracy),
    ("cache_hit_rates.png", "Prefix-cache hit rates", plot_cache_hits),
    ("accuracy_frontier.png", "Accuracy against compute", plot_frontier),
    ("ratio_by_device.png", "Simulated ratio by device (trace replay)", plot_ratio_by_device),
]


def _num(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if is_number(value) else 0.0


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None
