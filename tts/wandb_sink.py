"""The W&B sink (`RunLogger`): a run's config, records, summary and plots logged to Weights &
Biases, offline by default; a W&B failure never loses local results.

The mode comes from `logger.mode`, else `$WANDB_MODE`, else "offline" (it is never
hard-coded: the mode passed in code would override the environment).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from tts.results.store import flatten


class RunLogger:
    """Logs config, per-problem metrics, tables, plots and the summary; no-op when off."""

    def __init__(self, enabled: bool, mode: str | None, project: str, entity: str | None,
                 tags: list[str], run_dir: Path, config: dict[str, Any], name: str, group: str | None = None) -> None:
        self.run = None
        self.mode = mode or os.environ.get("WANDB_MODE") or "offline"
        if not enabled or self.mode == "disabled":
            return
        os.environ.setdefault("WANDB_MODE", self.mode)  # stops the telemetry host lookup offline
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            import wandb

            self.run = wandb.init(project=project, entity=entity, tags=tags or None, mode=self.mode,
                                  dir=str(run_dir), config=config, name=name, group=group,
                                  reinit="finish_previous")
        except Exception as err:  # any W&B failure: keep running, local results still land
            warnings.warn(f"W&B unavailable ({type(err).__name__}: {err}); continuing with local results only")
            self.run = None

    @classmethod
    def from_config(cls, config: dict, run_dir: Path, shard_dir: Path | None = None) -> RunLogger:
        """The logger a run's resolved config (`logger.*`) asks for, named after its folder,
        in its W&B group (`wandb_group`; of `shard_dir` for a merged run: its shards')."""
        logger = config.get("logger") or {}
        return cls(bool(logger.get("wandb")), logger.get("mode"), logger.get("project") or "tts",
                   logger.get("entity"), list(logger.get("tags") or []), run_dir, config, Path(run_dir).name,
                   wandb_group(config, shard_dir or run_dir))

    def _safe(self, fn, *args, **kwargs) -> None:
        if self.run is None:
            return
        try:
            fn(*args, **kwargs)
        except Exception as err:
            warnings.warn(f"W&B logging failed ({type(err).__name__}: {err}); local results unaffected")

    def log_problem(self, record: dict) -> None:
        metrics = {f"{record['variant']}/{k}": v for k, v in record["metrics"].items()
                   if isinstance(v, (int, float))}
        for method, ok in record.get("correct", {}).items():
            metrics[f"{record['variant']}/correct_{method}"] = int(ok)
        self._safe(self.run.log if self.run else None, metrics)

    def log_summary(self, summary: dict, tables: dict[str, list[dict]], plots: list[Path]) -> None:
        if self.run is None:
            return
        import wandb

        flat = flatten(summary, "/")
        self._safe(self.run.summary.update, {k: v for k, v in flat.items() if isinstance(v, (int, float, str))})
        for name, rows in tables.items():
            if rows:
                cols = list(rows[0])
                self._safe(self.run.log, {name: wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})
        for plot in plots:
            self._safe(self.run.log, {f"plots/{plot.stem}": wandb.Image(str(plot))})

    def finish(self) -> None:
        self._safe(self.run.finish if self.run else None)


def wandb_group(config: dict, path: Path) -> str | None:
    """The W&B group a run logs into: `logger.group`, else for a shard (`bench.shard`) its
    folder's parent (a sweep's folder, which every shard of the sweep shares), else none.
    A merged run (`tts merge`) logs into its shards' group."""
    logger, bench = config.get("logger") or {}, config.get("bench") or {}
    return logger.get("group") or (Path(path).resolve().parent.name if bench.get("shard") else None)
