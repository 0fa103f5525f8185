"""A run's PNG plots, in its `plots/` folder: goodput by variant, batch utilisation, tokens
per request and the accuracy frontier (drawn with `tts.plotting`)."""

from __future__ import annotations

from pathlib import Path

from tts.plotting import pyplot, save_figure
from tts.results.store import RunStore


def make_plots(store: RunStore, summary: dict, step_logs: dict[str, dict]) -> list[Path]:
    """Goodput by variant (the ablation bars), batch-utilisation histograms, and batch
    utilisation over time for each variant's generator."""
    store.plots.mkdir(exist_ok=True)
    out = []
    variants = summary["variants"]
    if variants:
        row = next((r for r in summary.get("ratios", []) if r.get("key") == "precise_goodput"), {})
        out.append(_bars(store.plots / "goodput_by_variant.png", variants, summary["baseline"], row))
    for model in ("generator", "verifier"):
        hists = {n: s[model]["batch_util_hist"] for n, s in variants.items() if model in s}
        if hists:
            out.append(_hist(store.plots / f"{model}_batch_util_hist.png", hists, model))
    traces = {n: log["generator"]["util_trace"] for n, log in step_logs.items()
              if "util_trace" in log.get("generator", {})}
    if traces:
        out.append(_traces(store.plots / "generator_util_over_time.png", traces))
    one = {n: log["generator"]["phase_util_traces"][1] for n, log in step_logs.items()
           if len(log.get("generator", {}).get("phase_util_traces", [])) > 1}
    if one:  # iteration 2: the first with speculative tokens to adopt
        out.append(_traces(store.plots / "generator_util_one_iteration.png", one,
                           title="Generator batch utilisation within one iteration (the 2nd)",
                           xlabel="time since the iteration's generation phase started (s)"))
    tpr = {n: s["generator"]["tokens_per_request_hist"] for n, s in variants.items()
           if s.get("generator", {}).get("tokens_per_request_hist")}
    if tpr:
        out.append(_tpr(store.plots / "generator_tokens_per_request.png", tpr))
    path = plot_frontier(store.plots / "accuracy_frontier.png", variants)
    if path:
        out.append(path)
    return out


def plot_frontier(path: Path, summaries: dict[str, dict]) -> Path | None:
    """Accuracy (majority, with its 95% interval) against generated tokens per problem and
    against completion latency, a point per variant (or per run of a threshold sweep, in
    `tts report`): the picture to choose a method and its threshold by. None without
    graded accuracy."""
    points = [(name, s) for name, s in summaries.items() if s.get("acc_majority_ci") and s.get("num_problems")]
    if not points:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), sharey=True)
    axis = (("generated tokens per problem", lambda s: s["total_gen_tokens"] / s["num_problems"]),
            ("completion latency (s, mean)", lambda s: s["latency_s_mean"]))
    for ax, (xlabel, x) in zip(axes, axis):
        for name, s in points:
            acc, (lo, hi) = s["acc_majority"], s["acc_majority_ci"]
            ax.errorbar([x(s)], [acc], yerr=[[acc - lo], [hi - acc]], fmt="o", capsize=3, label=name)
            ax.annotate(name, (x(s), acc), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("accuracy (majority), 95% interval")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle("Accuracy against compute")
    return save_figure(fig, path)


def _bars(path: Path, variants: dict, baseline: str, row: dict | None = None) -> Path:
    """Each variant's precise goodput over the baseline's, with the paired 95% interval the
    ratio table gives it (`row`: its precise-goodput row) as an error bar and in the label;
    a ratio without one says why, as the table does."""
    plt = pyplot()
    names = list(variants)
    base = variants[baseline].get("precise_goodput") or 1.0
    gains = [variants[n].get("precise_goodput", 0.0) / base for n in names]
    cis = [(row or {}).get(f"{n}/{baseline}_ci") for n in names]
    fig, ax = plt.subplots(figsize=(1.4 + 1.3 * len(names), 3.4))
    # the table's ratio is over the pairs both ran; where it lies outside its own interval
    # (a resampled ratio of few pairs), the bar shows no arm on that side
    errors = [[max(0.0, g - ci[0]) if ci else 0.0 for g, ci in zip(gains, cis)],
              [max(0.0, ci[1] - g) if ci else 0.0 for g, ci in zip(gains, cis)]]
    ax.bar(names, gains, color=["#999999"] + ["#2a7ab0"] * (len(names) - 1), yerr=errors, capsize=4)
    for i, (name, g, ci) in enumerate(zip(names, gains, cis)):
        label = f"{g:.2f}x" if name == baseline else (
            f"{g:.2f}x\n[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{g:.2f}x\n{(row or {}).get(f'{name}/{baseline}_ci_note') or 'no interval'}")
        ax.text(i, max(g, ci[1] if ci else g), label, ha="center", va="bottom", fontsize=7)
    ax.set_ylabel(f"precise goodput / {baseline}\n(paired 95% interval)")
    ax.set_title("Goodput by variant (higher is better)")
    return save_figure(fig, path)


def _hist(path: Path, hists: dict[str, list[int]], model: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bins = len(next(iter(hists.values())))
    width = 0.8 / len(hists)
    for k, (name, h) in enumerate(hists.items()):
        total = sum(h) or 1
        ax.bar([i + k * width for i in range(bins)], [x / total for x in h], width=width, label=name)
    ax.set_xticks(range(bins), [f"{i / bins:.1f}" for i in range(bins)], fontsize=7)
    ax.set_xlabel("batch utilisation (running / cap)")
    ax.set_ylabel("fraction of engine steps")
    ax.set_title(f"{model} batch utilisation")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _tpr(path: Path, hists: dict[str, dict[str, int]]) -> Path:
    """Tokens scheduled per request per engine step (decode shows as 1)."""
    plt = pyplot()
    buckets = list(dict.fromkeys(b for h in hists.values() for b in h))
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    width = 0.8 / len(hists)
    for k, (name, h) in enumerate(hists.items()):
        total = sum(h.values()) or 1
        ax.bar([i + k * width for i in range(len(buckets))], [h.get(b, 0) / total for b in buckets],
               width=width, label=name)
    ax.set_xticks(range(len(buckets)), buckets, fontsize=7)
    ax.set_xlabel("tokens scheduled per request in one step")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Generator tokens per request")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _traces(path: Path, traces: dict[str, list], title: str = "Batch utilisation over time",
            xlabel: str = "time (s)") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, trace in traces.items():
        if trace:
            ax.plot([t for t, _ in trace], [u for _, u in trace], label=name, lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("generator batch utilisation")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return save_figure(fig, path)
