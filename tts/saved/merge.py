"""`tts merge`: the shard folders of one run (`bench.shard=I/K`, each maybe on another
machine) joined into one run folder, in the format of an unsharded run: records, step logs,
trace, skipped problems and a summary recomputed over every problem, with paired intervals,
McNemar and the tree and verifier lines.

Every variant and seed of a problem ran in its shard, on one machine, so the pairs behind
every ratio are intact; absolute times are each shard's host's, and the summary lists the
hosts (`hosts`, and the headline when there are several kinds). A merge is refused, with
the difference named and nothing written, when the shards do not belong together: another
config, a shard missing or given twice, overlapping problems, another tts or vLLM version,
or a shard that has not finished.

The paths given may be shard folders or a sweep folder (its job folders are the shards), and
`results/<stamp>-sweep/*` works too: what is neither (the sweep's `multirun.yaml` and
`sweep.json`) is skipped, and said so.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tts.config.compose import ConfigError
from tts.config.shard import parse_shard
from tts.metrics.measures import merge_step_logs
from tts.results.store import CONFIG, RECORDS, RunStore, flatten

# settings a shard may differ in: where it wrote, which shard it is, how it logged
PER_SHARD = ("bench.shard", "bench.run_name", "bench.results_dir", "bench.resume", "logger.")


class Shard:
    """One shard folder, read once: its config, records and summary."""

    def __init__(self, path: Path) -> None:
        self.path, self.store = path, RunStore(path)
        if not path.is_dir():
            raise ConfigError(f"merge: {path}: no such run folder")
        if not (path / CONFIG).exists() or not (path / RECORDS).exists():
            raise ConfigError(f"merge: {path}: not a run folder (no {CONFIG} or {RECORDS})")
        self.config = self.store.saved_config()
        shard = (self.config.get("bench") or {}).get("shard")
        if not shard:
            raise ConfigError(f"merge: {path} is no shard (its bench.shard is not set): merge the folders of "
                              "a run split with bench.shard=I/K")
        self.index, self.count = parse_shard(shard)
        try:
            self.records = self.store.records()
            self.summary = self.store.summary()
        except (FileNotFoundError, ValueError) as err:
            raise ConfigError(f"merge: shard {self.index}/{self.count}: {err}") from None

    @property
    def name(self) -> str:
        return f"shard {self.index}/{self.count} ({self.path})"

    def settings(self) -> dict:
        return {k: v for k, v in flatten(self.config).items() if not k.startswith(PER_SHARD)}

    def versions(self) -> set[tuple]:
        """(tts, vLLM, torch) of each host its records ran on (the run's host for old records)."""
        hosts = self.summary.get("hosts") or [self.summary.get("host") or {}]
        return {(h.get("tts"), h.get("vllm"), h.get("torch")) for h in hosts}


def check(shards: list[Shard]) -> None:
    """Raise a ConfigError naming what keeps `shards` from being one run."""
    if not shards:
        raise ConfigError("merge: give the shard folders of one run")
    first = shards[0]
    counts = {s.count for s in shards}
    if len(counts) > 1:
        raise ConfigError("merge: the shards split the run differently: "
                          + ", ".join(f"{s.path} is {s.index}/{s.count}" for s in shards))
    for s in shards[1:]:
        a, b = first.settings(), s.settings()
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if differ:
            shown = "; ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in differ[:4])
            raise ConfigError(f"merge: {first.path} and {s.path} ran other configs ({shown}); "
                              "shards of one run differ only in bench.shard")
    seen: dict[int, Shard] = {}
    for s in shards:
        if s.index in seen:
            raise ConfigError(f"merge: shard {s.index}/{s.count} given twice ({seen[s.index].path}, {s.path})")
        seen[s.index] = s
    missing = [f"{i}/{first.count}" for i in range(first.count) if i not in seen]
    if missing:
        raise ConfigError(f"merge: missing shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
                          f"{first.count}: a merge needs every shard of the run (run it, or resume it with "
                          f"bench.shard=I/{first.count} --resume)")
    pending = [f"{s.name}: {', '.join(s.summary['pending'])}" for s in shards if s.summary.get("pending")]
    if pending:
        raise ConfigError("merge: incomplete shards (resume each with --resume): " + "; ".join(pending))
    owner: dict[str, Shard] = {}
    for s in shards:
        for pid in {r["problem_id"] for r in s.records}:
            if pid in owner:
                raise ConfigError(f"merge: problem {pid} is in {owner[pid].name} and {s.name}: the shards overlap")
            owner[pid] = s
    versions = {v for s in shards for v in s.versions()}
    if len(versions) > 1:
        raise ConfigError("merge: the shards ran other versions (tts, vLLM, torch): "
                          + "; ".join(f"{s.name}: {sorted(map(str, s.versions()))}" for s in shards))


def _is_run(path: Path) -> bool:
    return path.is_dir() and ((path / CONFIG).exists() or (path / RECORDS).exists())


def run_folders(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """The run folders among `paths`, a folder of run folders (a sweep's) standing for them,
    and the paths that are neither (a sweep's `multirun.yaml` or `sweep.json`). A path that does
    not exist, or no run folder at all, is an error."""
    runs: list[Path] = []
    skipped: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ConfigError(f"merge: {path}: no such run folder")
        if _is_run(path):
            runs.append(path)
            continue
        jobs = sorted(p for p in path.iterdir() if _is_run(p)) if path.is_dir() else []
        if jobs:
            runs += jobs
        else:
            skipped.append(path)
    if not runs:
        raise ConfigError(f"merge: no run folder among {', '.join(map(str, skipped))}: give the shard folders "
                          "of one run, or their sweep folder")
    return runs, skipped


def merge_runs(paths: list[Path], out: Path, say: Callable[[str], None] | None = None) -> Path:
    """Join the shard folders `paths` (or their sweep folder: `run_folders`) into the run folder
    `out` (new); returns it. `say` gets one line naming the paths skipped, if any. Nothing is
    written unless every check passes (`check`): the folder is built aside and moved in."""
    from omegaconf import OmegaConf

    from tts.results.summary import write_summary

    if out.exists():
        raise ConfigError(f"merge: {out} exists; give --out a new folder")
    runs, skipped = run_folders(paths)
    if skipped and say is not None:
        say(f"merge: skipped {', '.join(map(str, skipped))}: not run folders")
    shards = sorted((Shard(p) for p in runs), key=lambda s: s.index)
    check(shards)
    first = shards[0]
    names = list(first.summary["variants"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        work = Path(tmp) / out.name
        store = RunStore(work)
        store.plots.mkdir(parents=True)
        config = OmegaConf.create(first.config)
        config.bench.shard, config.bench.run_name, config.bench.results_dir = None, out.name, str(out.parent)
        store.write_config(OmegaConf.to_yaml(config))
        for position, s, record in sorted(_in_selection_order(shards), key=lambda x: x[0]):
            store.append({**record, "shard": f"{s.index}/{s.count}"})
        logs: dict[str, dict] = {}
        for s in shards:
            for name, log in s.store.step_logs().items():
                logs[name] = merge_step_logs(logs.get(name), log)
        store.write_step_logs(logs)
        store.write_skipped([row for s in shards for row in s.store.skipped()])
        raw = first.store.raw_generator()
        if raw:  # each shard timed its own host; the first's stands for the merged run
            store.write_raw_generator(raw)
        with open(store.trace, "wb") as trace:  # a trace is a series of gzip members
            for s in shards:
                if s.store.trace.exists():
                    trace.write(s.store.trace.read_bytes())
        shards_of = [{"shard": f"{s.index}/{s.count}", "folder": str(s.path), "records": len(s.records),
                      "host": s.summary.get("host")} for s in shards]
        summary, plots = write_summary(store, names, logs, first.summary.get("host"), pending=[],
                                       extra={"shards": shards_of})
        shutil.move(str(work), str(out))
    from tts.wandb_sink import RunLogger

    run = RunLogger.from_config(first.config, out, shard_dir=first.path)  # in the shards' group
    run.log_summary(summary, {}, [out / p.relative_to(work) for p in plots])
    run.finish()
    return out


def _in_selection_order(shards: list[Shard]) -> list[tuple[int, Shard, dict]]:
    """Each record with its problem's place in the unsharded selection: shard I of K holds
    the selection's I-th, (I+K)-th, ... problems, in the order its records first name them
    (exact where problems ran one at a time). The summary's bootstrap resamples records in
    their order, so the merged run's intervals are the unsharded run's."""
    out = []
    for s in shards:
        order = list(dict.fromkeys(r["problem_id"] for r in s.records))
        at = {pid: j * s.count + s.index for j, pid in enumerate(order)}
        out += [(at[r["problem_id"]], s, r) for r in s.records]
    return out
