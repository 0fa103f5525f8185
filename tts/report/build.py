"""`tts report`: runs side by side as a Markdown report with PNG plots.

The report folder holds ``report.md`` (the headline metrics with ratios against the
baseline, each column's key config, and the plots embedded), the PNGs next to it, and
``report.json`` with the same numbers unrounded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tts.report.ablation import ablation_lines, step_rows, tree_rows
from tts.report.plots import COLUMN_PLOTS, plot_memory_split
from tts.report.pressure import plot_pressure, pressure_rows, pressure_table
from tts.report.scaling import PLOT as SCALING_PLOT
from tts.report.scaling import plot_ratio_by_n, scaling_rows, scaling_section
from tts.report.sources import ReportError, RunData, load_runs
from tts.report.tables import Column, build_columns, config_table, metric_rows, resolve_baseline
from tts.results.host import host_differences, host_line
from tts.results.ratios import format_table

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
MEMORY_PLOT = "memory_split.png"
PRESSURE_PLOT = "pressure.png"


def write_report(runs: list[str], baseline: str | None = None, out: Path | None = None) -> Path:
    """`build_report`, returning the path of ``report.md``."""
    return build_report(runs, baseline, out)[0]


def build_report(runs: list[str], baseline: str | None = None, out: Path | None = None) -> tuple[Path, dict]:
    """Compare `runs` (result folders or ``wandb:entity/project/run_id``) and write the report.

    Each variant of a run is a column ("<run>/<variant>", or "<run>" for a single-variant
    run); ratios are taken against `baseline` (a column or run name; default the first
    column). Writes ``report.md``, ``report.json`` and the PNGs under `out` (default
    ``results/report-<timestamp>/``) and returns the path of ``report.md`` and what
    ``report.json`` holds (its ``host_warnings`` among it).
    Raises ReportError for a missing or corrupt run, or an unknown baseline.
    """
    loaded = load_runs([str(r) for r in runs])
    columns = build_columns(loaded)
    profiles = {r.name: r.profile for r in loaded if r.profile is not None}
    if not columns and not profiles:
        raise ReportError("nothing to report: no run has a summary.json or a profile.json")
    base = resolve_baseline(columns, loaded, baseline) if columns or baseline else None
    folder = _out_folder(out)
    plots = _make_plots(folder, columns, profiles)
    pressure = pressure_rows(loaded)
    if pressure:
        plots["Gains under memory pressure"] = plot_pressure(folder / PRESSURE_PLOT, pressure)
    rows = metric_rows(columns, base) if base else []
    sections = ["## Memory pressure", "", "Each variant against its run's first (the baseline), per cell of "
                "the sweep; thrash is KV recomputed after an eviction.", "", pressure_table(pressure)] if pressure else []
    scaling = scaling_rows(loaded)  # a sweep over search.n (`--config-name=paper_sweep`), measured or replayed
    tree, steps = tree_rows(loaded), step_rows(loaded)  # its gain taken apart
    if scaling:
        sections += scaling_section(scaling, plot_ratio_by_n(folder / SCALING_PLOT, scaling),
                                    ablation_lines(tree, steps))
    text = render_markdown(loaded, columns, base, rows, plots, sections)
    path = folder / REPORT_MD
    path.write_text(text, encoding="utf-8")
    data = _report_json(loaded, columns, base, rows, plots) | ({"pressure": pressure} if pressure else {})
    if scaling:
        data["scaling"] = {"rows": scaling, "tree": tree, "steps": steps, "plot": SCALING_PLOT.as_posix()
                           if (folder / SCALING_PLOT).exists() else None}
    (folder / REPORT_JSON).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path, data


def _out_folder(out: Path | None) -> Path:
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"report-{stamp}"
        k = 1
        while out.exists():
            k += 1
            out = Path("results") / f"report-{stamp}-{k}"
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _make_plots(folder: Path, columns: list[Column], profiles: dict[str, dict]) -> dict[str, Path | None]:
    """{title: PNG path, or None when the runs give nothing to draw}."""
    plots: dict[str, Path | None] = {}
    if columns:
        for filename, title, fn in COLUMN_PLOTS:
            plots[title] = fn(folder / filename, columns)
    if profiles:
        plots["Memory split sweep"] = plot_memory_split(folder / MEMORY_PLOT, profiles)
    return plots


def render_markdown(runs: list[RunData], columns: list[Column], baseline: str | None,
                    rows: list[dict], plots: dict[str, Path | None], sections: list[str] = ()) -> str:
    """The whole report.md: runs, headline metrics with ratios, key config, `sections`' lines
    (the memory-pressure table, the scaling sweep), plots."""
    parts = ["# tts report", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}.", "", "## Runs", ""]
    parts += [f"- `{r.name}`: {r.source}" + ("" if r.variants else " (memory profile only)")
              + (f"; {host_line(r.host)}" if r.variants else "") for r in runs]
    warnings = host_warnings(runs)
    if warnings:
        parts += ["", "**Warning: these runs come from different hosts or dtypes, or one has no recorded "
                  "host; ratios across hosts do not compare.**", ""] + [f"- {w}" for w in warnings]
    if columns:
        names = [c.name for c in columns]
        parts += ["", "## Headline metrics", "",
                  f"Baseline: `{baseline}`; a column `X ÷ {baseline}` holds X's value divided by the baseline's.", "",
                  _metric_table(rows, names, baseline), "", "## Key config", "", config_table(columns)]
    parts += ["", *sections, "", "## Plots", ""] if sections else ["", "## Plots", ""]
    for title, path in plots.items():
        parts += [f"### {title}", "", f"![{title}]({path.name})" if path else "_no data in these runs_", ""]
    missing = [r.name for r in runs if r.profile is None]
    if len(missing) == len(runs):
        parts += ["_No memory profile (`profile.json` from `tts profile-memory`) among these runs._", ""]
    return "\n".join(parts)


def host_warnings(runs: list[RunData]) -> list[str]:
    """What differs between the hosts (CPU, bf16/AMX, GPU, dtypes) of the runs with results."""
    return host_differences({r.name: r.host for r in runs if r.variants}) if len(
        [r for r in runs if r.variants]) > 1 else []


def _metric_table(rows: list[dict], names: list[str], baseline: str) -> str:
    """`format_table`, with ratio headers written "X ÷ B" (column names may hold a "/")."""
    lines = format_table(rows, names, baseline).split("\n")
    cols = names + [f"{n} ÷ {baseline}" for n in names if n != baseline]
    lines[0] = "| metric | " + " | ".join(cols) + " |"
    return "\n".join(lines)


def _report_json(runs: list[RunData], columns: list[Column], baseline: str | None,
                 rows: list[dict], plots: dict[str, Path | None]) -> dict[str, Any]:
    return {
        "runs": {r.name: r.source for r in runs},
        "columns": [{"name": c.name, "run": c.run.name, "variant": c.variant} for c in columns],
        "baseline": baseline,
        "hosts": {r.name: r.host for r in runs if r.variants},
        "host_warnings": host_warnings(runs),
        "rows": rows,
        "plots": {title: p.name for title, p in plots.items() if p},
    }
