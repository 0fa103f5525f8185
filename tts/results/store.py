"""One folder per run (`RunStore`): the resolved config, per-problem JSONL records, a
summary, plots; and the names of the files a run folder holds, in one place.

Records are appended and flushed to disk as each problem finishes, so a killed run
keeps everything it finished; `resume` reads them back and the run skips those problems.
A last line cut off by a kill is dropped (and reported), never misread. The engines' step
statistics (batch utilisation, KV traces) are rewritten with each record to
`step_logs.json` (atomically), so they survive a kill too and a resume adds to them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from tts.trace.format import TRACE

# The files of a run folder: the resolved config, the records, the summary and its tables, the
# engines' step statistics, raw vLLM's rate, the problems left out, the PNGs; a memory
# profile's result (`tts profile-memory`); a sweep job's overrides (`tts.hydra_app`), and in
# a sweep's own folder its jobs' headline metrics. The trace (`TRACE`, trace.jsonl.gz) is
# named by its format, a layer below (`tts.trace.format`): `RunStore.trace`.
CONFIG = "config.yaml"
RECORDS = "records.jsonl"
SUMMARY = "summary.json"
SUMMARY_MD = "summary.md"
STEP_LOGS = "step_logs.json"
RAW_GENERATOR = "raw_generator.json"
SKIPPED = "skipped.json"
PLOTS = "plots"
PROFILE = "profile.json"
JOB = "job.json"
SWEEP_SUMMARY = "sweep.json"


class RunStore:
    """Reads and writes a run folder."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.plots = self.path / PLOTS
        self.trace = self.path / TRACE

    @classmethod
    def create(cls, results_dir: str | Path, run_name: str | None, resume: bool, hint: str, *,
               resumable: bool = True) -> RunStore:
        """The run folder `results_dir/run_name` (else a timestamp and `hint`), made; with
        `resume` it may hold the run already. ValueError for `resume` without a name,
        FileExistsError for a folder that holds files (`resumable`: the verb has `--resume`,
        and the message says so)."""
        base = Path(results_dir)
        if resume and not run_name:
            runs = sorted(p.parent.name for p in base.glob(f"*/{RECORDS}"))
            listed = f"; runs in {base}: {', '.join(runs[-5:])}" if runs else f"; {base} holds no run"
            raise ValueError("--resume continues the run folder named by bench.run_name: pass "
                             f"bench.run_name=NAME{listed}")
        name = run_name or time.strftime("%Y%m%d-%H%M%S-") + hint
        path = base / name
        if path.exists() and not resume and any(path.iterdir()):
            raise FileExistsError(f"results folder {path} already holds a run; "
                                  + ("pass --resume to continue it or " if resumable else "")
                                  + "choose another bench.run_name")
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    def config_changes(self, config: dict) -> list[str]:
        """Settings of `config` that differ from the run's saved `config.yaml`, as
        "key: saved -> now" (`bench.results_dir` compared as the folder it names, absolute or
        relative to the working directory). Not compared: settings only one side has (another
        version of tts), those that cannot change a record (`bench.resume`, `bench.order`,
        `bench.warmup`, `logger.*`), the subset's size and choice, the list of compared variants
        and the seeds (a resumed run may take more problems, variants or seeds: records are per
        problem, seed and variant; each variant's own settings, `bench.optim_overrides`
        included, are still compared)."""
        saved = self.saved_config()
        if not saved:
            return []
        old, new = flatten(saved), flatten(config)
        skip = ("bench.resume", "bench.order", "bench.warmup", "logger.", "dataset.first_k", "dataset.random_k", "dataset.ids", "dataset.levels")
        return [f"{k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old.keys() & new.keys())
                if not _same_setting(k, old[k], new[k]) and not k.startswith(skip)
                and k not in ("bench.compare", "bench.search_variants", "bench.seeds")]

    def saved_config(self) -> dict:
        """The run's `config.yaml` as a dict ({} when there is none)."""
        import yaml

        path = self.path / CONFIG
        if not path.exists():
            return {}
        from tts.config.replaced import upgrade_saved

        try:
            return upgrade_saved(yaml.safe_load(path.read_text()) or {})
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: corrupt config ({err})") from err

    def write_config(self, yaml_text: str) -> None:
        (self.path / CONFIG).write_text(yaml_text)

    def append(self, record: dict) -> None:
        line = json.dumps(record, default=_jsonable) + "\n"
        path = self.path / RECORDS
        if path.exists() and path.stat().st_size:  # a kill between a record and its newline
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        return list(self.iter_records())

    def rewrite_records(self, records: list[dict]) -> None:
        """Replace the run's records with `records`, atomically (a kill leaves the old file)."""
        tmp = self.path / (RECORDS + ".tmp")
        tmp.write_text("".join(json.dumps(r, default=_jsonable) + "\n" for r in records), encoding="utf-8")
        os.replace(tmp, self.path / RECORDS)

    def iter_records(self) -> Iterator[dict]:
        path = self.path / RECORDS
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                if i == len(lines) and not line.endswith("\n"):
                    self._drop_partial_tail(line)
                    return
                raise ValueError(f"{path}: line {i} is not a JSON record ({err.msg})") from err

    def _drop_partial_tail(self, line: str) -> None:
        """Cut a record half-written by a killed run, so appends start on a fresh line."""
        path = self.path / RECORDS
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size - len(line.encode("utf-8")))

    def done_keys(self, default_seed: int = 0) -> set[tuple[str, str, int]]:
        """(variant, problem id, seed) of every record; a record written before records
        carried their seed ran under `default_seed` (the run's `bench.seed`)."""
        return {(r.get("variant", ""), r["problem_id"], r.get("seed", default_seed)) for r in self.iter_records()}

    def write_summary(self, summary: dict) -> None:
        (self.path / SUMMARY).write_text(json.dumps(summary, indent=2, default=_jsonable))

    def write_step_logs(self, logs: dict[str, dict]) -> None:
        """Step statistics per variant; replaced atomically (a kill leaves the old file)."""
        tmp = self.path / (STEP_LOGS + ".tmp")
        tmp.write_text(json.dumps(logs, default=_jsonable))
        os.replace(tmp, self.path / STEP_LOGS)

    def step_logs(self) -> dict[str, dict]:
        """What `write_step_logs` wrote last; {} when there is none (a run from before it)."""
        return self._read_json(STEP_LOGS, {}, "step statistics",
                               "; delete it to resume without the earlier part's batch utilisation")

    def write_raw_generator(self, raw: dict) -> None:
        """Raw vLLM's generator tok/s measured for this run (`bench.raw_generator`)."""
        (self.path / RAW_GENERATOR).write_text(json.dumps(raw, indent=2))

    def raw_generator(self) -> dict | None:
        """What `write_raw_generator` wrote; None when the run measured none."""
        return self._read_json(RAW_GENERATOR, None, "raw generator measurement",
                               "; delete it and resume to measure again")

    def write_skipped(self, skipped: list[dict]) -> None:
        """The problems the run left out (a prompt longer than the engines hold), each with
        its reason (`tts.problems.fit_prompts`)."""
        (self.path / SKIPPED).write_text(json.dumps(skipped, indent=2))

    def skipped(self) -> list[dict]:
        """What `write_skipped` wrote; [] when the run skipped nothing (or predates it)."""
        return self._read_json(SKIPPED, [], "list of skipped problems")

    def summary(self) -> dict:
        path = self.path / SUMMARY
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run folder")
        if not path.exists() and not (self.path / RECORDS).exists():
            raise FileNotFoundError(f"{self.path}: not a run folder (no {RECORDS}, no {SUMMARY})")
        if not path.exists():
            raise FileNotFoundError(f"{self.path}: no {SUMMARY} (the run did not finish; `tts eval {self.path}` "
                                    "rebuilds it from the records)")
        return self._read_json(SUMMARY, None, "summary")

    def _read_json(self, name: str, missing, what: str, advice: str = ""):
        """The run folder's JSON file `name`, or `missing` where there is none; a ValueError
        that says `what` is corrupt (then `advice`) where it does not parse."""
        path = self.path / name
        if not path.exists():
            return missing
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: corrupt {what} ({err.msg}){advice}") from err


def _same_setting(key: str, saved, now) -> bool:
    """Whether a setting is unchanged; the results folder is the same folder however it is
    written (a sweep's job records its absolute path; a resume may give it relative)."""
    if key == "bench.results_dir" and saved and now:
        return Path(saved).expanduser().resolve() == Path(now).expanduser().resolve()
    return saved == now


def flatten(tree: dict, sep: str = ".", prefix: str = "") -> dict:
    """Nested mappings as one: {"a": {"b": 1}} -> {"a.b": 1}, the keys joined by `sep` (a
    config compared setting by setting; "/" for the W&B summary)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, sep, f"{prefix}{key}{sep}"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _jsonable(obj):
    if hasattr(obj, "value"):
        return obj.value
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


_SWEEP_METRICS = ("precise_goodput", "latency_s_mean", "tokens_per_s", "problems_per_min", "acc_majority",
                  "acc_majority_ci", "pass@n")


def write_sweep_summary(sweep: Path) -> Path | None:
    """`sweep.json` in a sweep folder: each job folder with a summary, its overrides (from
    `job.json` or its config) and its variants' headline metrics; None without jobs.
    `tts report <sweep folder>` compares the job folders."""
    jobs = []
    for summary_path in sorted(Path(sweep).glob("*/" + SUMMARY)):
        folder = summary_path.parent
        summary = json.loads(summary_path.read_text())
        meta = json.loads((folder / JOB).read_text()) if (folder / JOB).exists() else {}
        jobs.append({"folder": folder.name, "overrides": meta.get("overrides"), "host": summary.get("host"),
                     "variants": {name: {k: v.get(k) for k in _SWEEP_METRICS}
                                  for name, v in summary.get("variants", {}).items()}})
    if not jobs:
        return None
    path = Path(sweep) / SWEEP_SUMMARY
    path.write_text(json.dumps({"sweep": str(sweep), "jobs": jobs}, indent=2))
    return path
