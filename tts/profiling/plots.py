"""PNG plots of `tts profile-memory` (matplotlib imported lazily, Agg backend).

- ``memory_breakdown.png``: each model's memory components (thesis Fig 5.1).
- ``split_throughput.png``: system, generator and verifier throughput against the
  generator's share of the KV budget (Fig 5.2).
- ``kv_blocks_per_step.png``: KV blocks in use at each scheduling step, per model, at the
  tight and the loose split (Fig 5.3).
- ``cache_hit_rates.png``: prefix-cache hit rate of both models across splits (Fig 6.1).
- ``thrash.png``: thrash events (and evictions) of both models across splits (Fig 6.2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tts.backends.vllm.memory_breakdown import COMPONENTS
from tts.plotting import pyplot, save_figure

MIB = 2**20
ROLES = (("generator", "gen"), ("verifier", "ver"))


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["generator_fraction"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def plot_breakdown(path: Path, breakdown: dict[str, dict[str, Any]]) -> Path | None:
    """Stacked bars of each model's memory components, in MiB."""
    roles = [r for r, _ in ROLES if r in breakdown]
    if not roles:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    parts = [(k, label) for k, label in COMPONENTS
             if k not in ("measured_start_bytes", "non_torch_bytes")]
    bottoms = [0.0] * len(roles)
    for key, label in parts:
        values = [max(0.0, float(breakdown[r].get(key) or 0)) / MIB for r in roles]
        ax.bar(roles, values, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_ylabel("MiB")
    ax.set_title("Memory per model")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_throughput(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Fig 5.2: throughputs against the generator's share of the KV budget."""
    if not rows:
        return None
    plt = pyplot()
    panels = (("system_tokens_per_s", "system (generated tok/s)"),
              ("generator_tokens_per_s", "generator (tok/s of its time)"),
              ("verifier_tokens_per_s", "verifier (prompt tok/s of its time)"))
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    for ax, (key, title) in zip(axes, panels):
        xs, ys = _series(rows, key)
        ax.plot(xs, ys, marker="o")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("generator share of KV memory")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens / s")
    fig.suptitle("Throughput across the generator/verifier KV split")
    return save_figure(fig, path)


def plot_hit_rates(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Fig 6.1: prefix-cache hit rates of both models across splits."""
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for role, prefix in ROLES:
        xs, ys = _series(rows, f"{prefix}_hit_rate")
        if xs:
            ax.plot(xs, ys, marker="o", label=role)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("generator share of KV memory")
    ax.set_ylabel("cached / prompt tokens")
    ax.set_title("Prefix-cache hit rate")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_thrash(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Fig 6.2: thrash events per model across splits, with evictions for scale."""
    if not rows:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (key, title) in zip(axes, (("thrash", "thrash events"), ("evictions", "evictions"))):
        for role, prefix in ROLES:
            xs, ys = _series(rows, f"{prefix}_{key}")
            if xs:
                ax.plot(xs, ys, marker="o", label=role)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("generator share of KV memory")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("count")
    fig.suptitle("KV-cache thrashing (evicted, then needed again)")
    return save_figure(fig, path)


def plot_blocks_per_step(path: Path, traces: dict[str, dict[str, Any]]) -> Path | None:
    """Fig 5.3: KV blocks in use at each scheduling step; rows = models, columns = splits."""
    names = [n for n in ("tight", "loose") if n in traces]
    if not names:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 5.6), squeeze=False)
    for col, name in enumerate(names):
        trace = traces[name]
        for row, (role, _) in enumerate(ROLES):
            ax = axes[row][col]
            blocks = trace.get(role) or []
            ax.plot(range(len(blocks)), blocks, lw=0.8)
            capacity = trace.get(f"{role}_usable_blocks")
            if capacity:
                ax.axhline(capacity, color="red", ls="--", lw=0.8, label="blocks in the pool")
                ax.legend(fontsize=7)
            ax.set_title(f"{role}, generator share {trace['generator_fraction']:.2f} ({name})",
                         fontsize=9)
            ax.set_xlabel("scheduling step")
            ax.set_ylabel("KV blocks in use" if capacity else "KV usage")
            ax.grid(alpha=0.3)
    return save_figure(fig, path)


def write_plots(folder: Path, profile: dict[str, Any]) -> dict[str, str]:
    """Every plot the profile has data for; returns {title: file name}."""
    rows = profile.get("sweep") or []
    made = {
        "memory breakdown": plot_breakdown(folder / "memory_breakdown.png", profile.get("breakdown") or {}),
        "split throughput": plot_throughput(folder / "split_throughput.png", rows),
        "KV blocks per step": plot_blocks_per_step(folder / "kv_blocks_per_step.png",
                                                   profile.get("kv_blocks_per_step") or {}),
        "cache hit rates": plot_hit_rates(folder / "cache_hit_rates.png", rows),
        "thrash": plot_thrash(folder / "thrash.png", rows),
    }
    return {title: p.name for title, p in made.items() if p is not None}
