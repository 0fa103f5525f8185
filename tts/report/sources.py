"""Loading the runs a report compares: local result folders and W&B runs.

A local run is a folder written by `tts bench` (``summary.json``, ``config.yaml``,
``records.jsonl``) or by `tts profile-memory` (``profile.json``). A W&B run is named
``wandb:entity/project/run_id``; its summary and config are fetched through
``wandb.Api()``, which needs network access and a `wandb login`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts.results.store import CONFIG, PROFILE, RECORDS, SUMMARY

WANDB_PREFIX = "wandb:"


class ReportError(ValueError):
    """A run cannot be read, or the report's arguments do not fit the runs."""


@dataclass
class RunData:
    """One run as the report sees it: its variants' summaries, its config, its profile."""

    name: str  # the label its columns are built from
    source: str  # the folder or W&B path it came from
    variants: dict[str, dict] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] | None = None
    host: dict[str, Any] | None = None  # `tts.results.host.host_info` of the run, if recorded
    # its per-problem records (a local folder's records.jsonl; none from W&B): the speed
    # ratios' paired intervals are computed from them
    records: list[dict] = field(default_factory=list)
    ratios: list[dict] = field(default_factory=list)  # its summary's ratio table (`ratios`), if any
    # a replay's (`tts replay`) counts of what the trace served each variant, by variant
    # (summary.json's `simulated.served`: `tts.replay.served.ReplayCounts`); empty for a measured run
    served: dict[str, dict] = field(default_factory=dict)

    def variant_records(self, variant: str) -> list[dict]:
        """The records of one variant, each with its seed (the run's `bench.seed` where a
        record predates records carrying theirs)."""
        seed = (self.config.get("bench") or {}).get("seed") or 0
        return [r if "seed" in r else {**r, "seed": seed} for r in self.records
                if r.get("variant", "") == variant and "problem_id" in r and isinstance(r.get("metrics"), dict)]

    def drawn_shares(self, variant: str) -> tuple[float | None, float | None]:
        """A replayed variant's shares of its tokens and of its scores that the trace did not
        hold, so were drawn (`tts.replay.sampler`); (None, None) for a measured run."""
        counts = self.served.get(variant) or {}
        return counts.get("drawn_token_share"), counts.get("drawn_score_share")

    def columns(self) -> list[tuple[str, str]]:
        """(column name, variant name): "<run>/<variant>" with several variants, else "<run>"."""
        if len(self.variants) == 1:
            return [(self.name, next(iter(self.variants)))]
        return [(f"{self.name}/{v}", v) for v in self.variants]


def load_runs(specs: list[str]) -> list[RunData]:
    """Load every run; folder names that collide are told apart by their parent folders."""
    if not specs:
        raise ReportError("no runs given: pass one or more result folders or wandb:entity/project/run_id")
    runs = [load_run(s) for s in expand_sweeps(specs)]
    _unique_names(runs)
    return runs


def expand_sweeps(specs: list[str]) -> list[str]:
    """A sweep folder (no summary or profile of its own, job folders with one below it)
    stands for its job folders, in order: `tts bench -m` and `tts profile-memory -m` jobs."""
    out = []
    for spec in specs:
        path = Path(spec)
        jobs = sorted({p.parent for name in (SUMMARY, PROFILE) for p in path.glob(f"*/{name}")},
                      key=_job_order) if path.is_dir() else []
        if not spec.startswith(WANDB_PREFIX) and jobs and not (path / SUMMARY).exists() \
                and not (path / PROFILE).exists():
            out += [str(j) for j in jobs]
        else:
            out.append(spec)
    return out


def _job_order(folder: Path) -> tuple:
    """Hydra's job folders are numbered: 2 before 10."""
    return (0, int(folder.name), "") if folder.name.isdigit() else (1, 0, folder.name)


def load_run(spec: str) -> RunData:
    """One run from a results folder or a ``wandb:entity/project/run_id`` path."""
    if spec.startswith(WANDB_PREFIX):
        return load_wandb_run(spec)
    return load_folder(Path(spec))


def load_folder(path: Path) -> RunData:
    """A local results folder; ReportError naming the folder when it is missing or corrupt."""
    if not path.exists():
        raise ReportError(f"{path}: no such results folder")
    if not path.is_dir():
        raise ReportError(f"{path}: not a folder (expected a tts results folder)")
    has_summary, has_profile = (path / SUMMARY).exists(), (path / PROFILE).exists()
    if not has_summary and not has_profile:
        raise ReportError(f"{path}: no {SUMMARY} (not a finished tts bench run; `tts eval {path}` "
                          f"rebuilds it from {RECORDS}) and no {PROFILE}")
    run = RunData(name=path.resolve().name, source=str(path))
    if has_summary:
        summary = _read_json(path / SUMMARY, "summary")
        run.variants = _variants(summary, path / SUMMARY)
        run.host = summary.get("host") if isinstance(summary.get("host"), dict) else None
        run.records = _read_records(path / RECORDS)
        run.ratios = summary["ratios"] if isinstance(summary.get("ratios"), list) else []
        run.served = _served(summary)
    if has_profile:
        run.profile = _read_json(path / PROFILE, "memory profile")
    run.config = _read_config(path / CONFIG)
    return run


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"{path.parent}: cannot read {path.name} ({err})") from err
    except json.JSONDecodeError as err:
        raise ReportError(f"{path.parent}: corrupt {what} {path.name} "
                          f"(line {err.lineno}: {err.msg})") from err
    if not isinstance(data, dict):
        raise ReportError(f"{path.parent}: corrupt {what} {path.name} (a JSON object expected, "
                          f"got {type(data).__name__})")
    return data


def _variants(summary: dict, path: Path) -> dict[str, dict]:
    variants = summary.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ReportError(f"{path.parent}: corrupt summary {path.name} (no 'variants' with per-variant metrics)")
    for name, metrics in variants.items():
        if not isinstance(metrics, dict):
            raise ReportError(f"{path.parent}: corrupt summary {path.name} (variant {name!r} is "
                              f"{type(metrics).__name__}, not a mapping of metrics)")
    return variants


def _served(summary: dict) -> dict[str, dict]:
    """A replay's `simulated.served` counts by variant; empty where the summary has none."""
    served = (summary.get("simulated") or {}).get("served") if isinstance(summary.get("simulated"), dict) else None
    return {k: v for k, v in served.items() if isinstance(v, dict)} if isinstance(served, dict) else {}


def _read_records(path: Path) -> list[dict]:
    """The records; every complete line of records.jsonl must be a JSON object (read-only:
    a line cut off by a killed run is left alone, as `tts bench --resume` handles it)."""
    records: list[dict] = []
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) and not line.endswith("\n"):
                return records
            raise ReportError(f"{path.parent}: corrupt {path.name} (line {i}: {err.msg})") from err
        if not isinstance(record, dict):
            raise ReportError(f"{path.parent}: corrupt {path.name} (line {i} is not a JSON object)")
        records.append(record)
    return records


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ReportError(f"{path.parent}: corrupt {path.name} ({err})") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ReportError(f"{path.parent}: corrupt {path.name} (a mapping expected)")
    return data


def load_wandb_run(spec: str) -> RunData:
    """A W&B run's summary and config, fetched online through ``wandb.Api()``."""
    run_path = spec[len(WANDB_PREFIX):].strip("/")
    if run_path.count("/") != 2 or not all(run_path.split("/")):
        raise ReportError(f"{spec}: a W&B run is named wandb:entity/project/run_id")
    need = "fetching a W&B run needs network access and a W&B login (`wandb login`)"
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled", "dryrun"):
        raise ReportError(f"{spec}: W&B is {mode} (WANDB_MODE); {need}")
    try:
        import wandb

        remote = wandb.Api(timeout=30).run(run_path)
        raw = getattr(remote, "summary_metrics", None)
        summary = unflatten(_plain(raw if isinstance(raw, Mapping) else dict(remote.summary.items())))
        config = _plain(dict(remote.config))
        name = str(getattr(remote, "name", "") or run_path.rsplit("/", 1)[-1])
    except Exception as err:  # any W&B failure (no login, no network, no such run)
        raise ReportError(f"{spec}: cannot fetch the W&B run ({type(err).__name__}: {err}); {need}") from err
    variants = summary.get("variants")
    if not isinstance(variants, dict) or not variants or not all(isinstance(v, dict) for v in variants.values()):
        raise ReportError(f"{spec}: the W&B run's summary has no per-variant metrics (variants/<name>/...); "
                          "was it logged by `tts bench`?")
    host = summary.get("host") if isinstance(summary.get("host"), dict) else None
    return RunData(name=name, source=spec, variants=variants, config=config, host=host, served=_served(summary))


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Nest "a/b/c" keys (how the W&B logger flattens the summary) back into dicts."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = str(key).split("/")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return out


def _plain(value: Any) -> Any:
    """W&B's summary and config objects as plain dicts and lists."""
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unique_names(runs: list[RunData]) -> None:
    """Give runs whose folder names collide longer names (parent/name), else their sources."""
    for depth in (2, 3):
        names = [r.name for r in runs]
        dupes = {n for n in names if names.count(n) > 1}
        if not dupes:
            return
        for run in runs:
            if run.name in dupes and not run.source.startswith(WANDB_PREFIX):
                run.name = "/".join(Path(run.source).resolve().parts[-depth:])
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:
            run.name = run.source
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ReportError(f"the same run is given twice: {sorted({n for n in names if names.count(n) > 1})}")


def variant_ratios(run: RunData, base: str, name: str, keys: Sequence[str]) -> dict[str, Any]:
    """A variant's ratios to `base` with their paired intervals, for every report table:
    `<key>`, `<key>_ci` ([low, high] or None), `<key>_text` ("[1.05, 1.41]", or why there is
    none) and `pairs`, as the run's ratio table holds them (`tts.results.ratios.ratio_table`).
    Where it holds none for a key (a W&B run's summary carries no ratio table; a folder
    written before the table held intervals), as that table would: the summaries' ratio and
    the records' paired interval (`speed_intervals`; none without records)."""
    from tts.results.intervals import bounds_text, speed_intervals
    from tts.results.ratios import ratio

    col, out = f"{name}/{base}", {}
    table = {r["key"]: r for r in run.ratios if isinstance(r, dict) and "key" in r}
    missing = [k for k in keys if col not in (table.get(k) or {})]
    records = run.variant_records(base), run.variant_records(name)
    if missing:
        point = {k: ratio(run.variants[name].get(k), run.variants[base].get(k)) for k in keys}
        cis = speed_intervals(*records, point) if all(records) else {}
    for key in keys:
        row = table.get(key) or {}
        if col in row:
            ci = row.get(f"{col}_ci")
            out |= {key: row[col], f"{key}_ci": ci, f"{key}_text": bounds_text(ci, row.get(f"{col}_ci_note") or "")}
            out["pairs"] = out.get("pairs") or (row.get("n_pairs") or {}).get(name)
        else:
            ci = cis.get(key)
            out |= {key: point[key], f"{key}_ci": ci.bounds if ci else None,
                    f"{key}_text": ci.text() if ci else "n/a (no records)"}
            out["pairs"] = out.get("pairs") or (ci.n_pairs if ci else None)
    return out
