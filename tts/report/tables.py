"""The report's columns, its baseline, the headline-metric table, the key-config table and
a sweep table's ratio cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tts.markdown import markdown_table, number
from tts.report.sources import ReportError, RunData
from tts.results.ratios import ratio_table

# Optim switches shown as flags when on (the letters follow the FlashTTS ablation names).
OPTIM_FLAGS = [("prefix_aware", "P"), ("roofline_memory", "M"), ("speculative", "S"), ("lookahead", "L")]


@dataclass
class Column:
    """One column of the report: a variant of a run, with the config it ran under."""

    name: str
    run: RunData
    variant: str
    metrics: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)

    def get(self, section: str, key: str) -> Any:
        """A config value, or None when the run's config does not hold it."""
        value = self.config.get(section)
        return value.get(key) if isinstance(value, dict) else None

    @property
    def n(self) -> int | None:
        """search.n, the number of candidates, or None when unknown."""
        value = self.get("search", "n")
        return value if isinstance(value, int) else None


def build_columns(runs: list[RunData]) -> list[Column]:
    """One column per variant of each run that has a summary, in the order given."""
    columns = []
    for run in runs:
        for name, variant in run.columns():
            config = dict(run.config)
            compare = (config.get("bench") or {}).get("compare") or []
            if variant in compare:
                config["optim"] = preset_optim(variant, (config.get("bench") or {}).get("optim_overrides") or [])
            columns.append(Column(name, run, variant, run.variants[variant], config))
    return columns


def preset_optim(name: str, overrides: list[str] = ()) -> dict[str, Any]:
    """The optim settings of a `bench.compare` preset (the schema defaults under
    conf/optim/NAME.yaml), with the run's `bench.optim_overrides` (`KEY=VALUE`) on top."""
    import yaml

    from tts.config.compose import CONF_DIR

    defaults = {"engine": "baseline", "score_cache": True, "speculative": False, "lookahead": False,
                "prefix_aware": False, "roofline_memory": False, "decoupled_policy": "eager_first"}
    path = CONF_DIR / "optim" / f"{name}.yaml"
    if not path.exists():
        return {**defaults, "engine": name}
    on_top = {key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in overrides)}
    return {**defaults, **(yaml.safe_load(path.read_text()) or {}), **on_top}


def resolve_baseline(columns: list[Column], runs: list[RunData], baseline: str | None) -> str:
    """The baseline column: a column name, or a run's name (its first column); default the first."""
    if not columns:
        raise ReportError("none of the runs has a summary.json to compare: "
                          + ", ".join(r.source for r in runs))
    if baseline is None:
        return columns[0].name
    names = [c.name for c in columns]
    if baseline in names:
        return baseline
    for run in runs:
        if baseline in (run.name, run.source) and run.variants:
            return run.columns()[0][0]
    valid = list(dict.fromkeys(names + [r.name for r in runs if r.variants]))
    raise ReportError(f"--baseline {baseline!r} is neither a column nor a run; valid names: {', '.join(valid)}")


def metric_rows(columns: list[Column], baseline: str) -> list[dict]:
    """The headline metrics (`RATIO_METRICS`): each column's value and its ratio to the
    baseline's; a speed ratio with its paired 95% interval over the (problem, seed) pairs
    both columns ran, where both runs' records are at hand (`ratio_table`)."""
    records = {c.name: c.run.variant_records(c.variant) for c in columns if c.run.records}
    return ratio_table({c.name: c.metrics for c in columns}, baseline, records)


def engine_label(optim: dict[str, Any]) -> str:
    """The engine and its switched-on optimisations, e.g. "flash+PMS" or "decoupled (eager_first)"."""
    if not optim:
        return "-"
    engine = str(optim.get("engine", "-"))
    if engine == "decoupled":
        return f"decoupled ({optim.get('decoupled_policy', '-')})"
    flags = "".join(letter for key, letter in OPTIM_FLAGS if optim.get(key))
    return f"{engine}+{flags}" if flags else engine


def config_row(column: Column) -> dict[str, str]:
    """The key config of a column, as display strings."""
    optim = column.config.get("optim") or {}
    off = [k for k in ("score_cache", "eos_at_depth_limit") if optim.get(k) is False]
    return {
        "column": column.name,
        "algorithm": _s(column.get("search", "algorithm")),
        "N": _s(column.n),
        "beam width": _s(column.get("search", "beam_width")),
        "engine": engine_label(optim),
        "flags off": ", ".join(off) or "-",
        "dataset": _dataset(column.config.get("dataset") or {}),
        "problems": _s(column.metrics.get("num_problems")),
        "generator": _s(column.get("generator", "model")),
        "verifier": _s(column.get("verifier", "model")),
        "memory": _memory(column.config.get("memory") or {}, optim),
    }


def _memory(memory: dict[str, Any], optim: dict[str, Any]) -> str:
    """The KV budget and how it is split, e.g. "1.0 GiB, roofline" or "1.0 GiB, static 0.5"."""
    if memory.get("kv_cache_gib") is None:
        return "-"
    split = "roofline" if optim.get("roofline_memory") else f"static {memory.get('generator_fraction', '-')}"
    return f"{memory['kv_cache_gib']} GiB, {split}"


def config_table(columns: list[Column]) -> str:
    """A Markdown table of each column's key config."""
    rows = [config_row(c) for c in columns]
    keys = list(rows[0])
    return markdown_table(keys, ([_cell(r[k]) for k in keys] for r in rows))


def ratio_cell(row: dict[str, Any], key: str) -> str:
    """A variant's ratio to its run's first variant in a sweep's table (the pressure cells, the
    scaling sweep): "1.23x [1.05, 1.41]" (`<key>`, `<key>_text`), or "(baseline)" on the
    first variant's own row."""
    if row["variant"] == row["baseline"]:
        return "(baseline)"
    return interval_cell(row, key)


def interval_cell(row: dict[str, Any], key: str) -> str:
    """A ratio with its paired interval, "1.23x [1.05, 1.41]" (`<key>`, `<key>_text`), or
    with the reason it has none ("1.23x n/a (1 problem)")."""
    return f"{number(row.get(key), '{:.2f}x')} {row.get(f'{key}_text', '')}".strip()


def _dataset(ds: dict[str, Any]) -> str:
    if not ds:
        return "-"
    text = str(ds.get("name", "-"))
    if ds.get("split"):
        text += f":{ds['split']}"
    if ds.get("first_k"):
        text += f" first {ds['first_k']}"
    if ds.get("random_k"):
        text += f" random {ds['random_k']} (seed {ds.get('seed', 0)})"
    return text


def _s(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
