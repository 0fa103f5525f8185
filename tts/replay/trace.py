"""A run's trace: what the engine saw from its two models, in `trace.jsonl.gz`.

Every generation request (its seed, its prompt as a hash and a length, the tokens it
produced, how it ended, whether the engine sent it as speculation) and every score (which
path and step, as a hash of the problem and the steps' texts, and the score returned).
The file is a series of gzip members, one per flush: the runner flushes with each record,
so a killed run keeps the trace of everything it finished, and `--resume` appends to it.
A last member cut off by a kill is dropped when read (and said), never misread.

Prompts are keyed by a polynomial rolling hash of their token ids, so that the key of a
prompt extended by some of a recorded request's output is computed from the recorded
prompt's key: a replay with a resumable sampler (`generator.sampler=position`) finds the
rest of a step it resumes in the request that first sampled it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tts.backends.base import FinishReason, GenDelta, Generator, GenRequest, ScoreRequest, StepStats, Verifier
from tts.engine.model_runner import SPECULATIVE_PREFIX

TRACE = "trace.jsonl.gz"
VERSION = 1
_MOD = (1 << 61) - 1
_BASE = 1_000_003


def extend_hash(h: int, token_ids: Sequence[int]) -> int:
    """The rolling hash of a prompt extended by `token_ids` (0 is the empty prompt's)."""
    for t in token_ids:
        h = (h * _BASE + t + 1) % _MOD
    return h


def score_key(problem: str, steps: Sequence[str]) -> str:
    """The key of the score of a path's last step (`steps` up to and including it)."""
    return hashlib.blake2b(json.dumps([problem, *steps]).encode(), digest_size=10).hexdigest()


class TraceRecorder:
    """Records the requests and scores of one run's models; `flush` appends what it holds."""

    def __init__(self, path: Path, header: dict) -> None:
        self.path = Path(path)
        if self.path.exists():  # a resume: a member a kill cut off goes, so what follows reads
            _, _, whole = _members(self.path.read_bytes())
            with open(self.path, "r+b") as f:
                f.truncate(whole)
        fresh = not self.path.exists() or not self.path.stat().st_size
        self._lines: list[dict] = [{"t": "h", "version": VERSION, **header}] if fresh else []
        self._live: dict[str, dict] = {}
        self.variant = ""

    def attach(self, variant: str, generator: Generator, verifier: Verifier | None):
        """Record `variant`'s requests and scores on these backends; returns the detacher."""
        self.variant = variant
        if self._lines and self._lines[0]["t"] == "h":  # the header, not written yet
            self._lines[0].setdefault("eos", sorted(generator.eos_token_ids))
        removers = [generator.add_request_observer(self._added, self._aborted),
                    generator.add_step_observer(self._stepped)]
        if verifier is not None:
            removers.append(verifier.add_result_observer(self._scored))

        def detach() -> None:
            for remove in removers:
                remove()

        return detach

    def _added(self, request: GenRequest) -> None:
        self._live[request.request_id] = {
            "t": "g", "v": self.variant, "seed": request.seed, "h": extend_hash(0, request.prompt_token_ids),
            "p": len(request.prompt_token_ids), "max": request.max_tokens,
            "spec": request.request_id.startswith(SPECULATIVE_PREFIX), "o": []}

    def _stepped(self, deltas: list[GenDelta], stats: StepStats, wall_s: float) -> None:
        for d in deltas:
            live = self._live.get(d.request_id)
            if live is None:
                continue
            live["o"].extend(d.new_token_ids)
            if d.finished:
                self._end(d.request_id, d.finish_reason.value)

    def _aborted(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._end(rid, FinishReason.ABORTED.value)

    def _end(self, request_id: str, finish: str) -> None:
        live = self._live.pop(request_id, None)
        if live is not None:
            self._lines.append({**live, "f": finish})

    def _scored(self, requests: Sequence[ScoreRequest], scores: list[tuple[float, ...]]) -> None:
        for req, values in zip(requests, scores):
            for i, value in zip(req.indices, values):
                self._lines.append({"t": "s", "v": self.variant, "k": score_key(req.problem, req.steps[: i + 1]),
                                    "d": i, "r": float(value)})

    def flush(self) -> None:
        """Append what was recorded since the last flush, as one gzip member."""
        if not self._lines:
            return
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in self._lines)
        with open(self.path, "ab") as f:
            f.write(gzip.compress(text.encode()))
        self._lines = []


@dataclass(frozen=True)
class Generation:
    """One recorded request's output."""

    tokens: tuple[int, ...]
    finish: str  # a FinishReason value
    speculative: bool

    @property
    def finished(self) -> bool:
        return self.finish != FinishReason.ABORTED.value


@dataclass
class Trace:
    """A trace read back: its header, the generations by (seed, prompt hash), the scores
    by key, and what reading found."""

    header: dict
    generations: dict[tuple[int, int], Generation] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    score_depths: dict[int, list[float]] = field(default_factory=dict)
    requests: int = 0
    truncated: bool = False  # the last member was cut off (a killed run)
    _resume: dict[tuple[int, int], tuple[Generation, int]] | None = None

    def add(self, line: dict) -> None:
        if line["t"] == "g":
            self.requests += 1
            new = Generation(tuple(line["o"]), line["f"], line.get("spec", False))
            key = (line["seed"], line["h"])
            old = self.generations.get(key)
            if old is None or (new.finished, len(new.tokens)) > (old.finished, len(old.tokens)):
                self.generations[key] = new
        elif line["t"] == "s":
            self.scores[line["k"]] = line["r"]
            self.score_depths.setdefault(line["d"], []).append(line["r"])

    def generation(self, seed: int, prompt_hash: int, resumable: bool) -> tuple[Generation, int] | None:
        """The recorded output a request (seed, prompt) gets, and where in it the request
        starts: 0 for the request recorded itself; with a resumable sampler also a request
        whose prompt is a recorded prompt plus the first k tokens of its output."""
        exact = self.generations.get((seed, prompt_hash))
        if exact is not None or not resumable:
            return (exact, 0) if exact is not None else None
        if self._resume is None:
            self._resume = {}
            for (s, h), gen in self.generations.items():
                for k, token in enumerate(gen.tokens[:-1], start=1):
                    h = extend_hash(h, (token,))
                    old = self._resume.get((s, h))
                    if old is None or len(gen.tokens) - k > len(old[0].tokens) - old[1]:
                        self._resume[(s, h)] = (gen, k)
        return self._resume.get((seed, prompt_hash))


def read_trace(path: Path) -> Trace:
    """Read a trace file; ValueError naming the file when it is not one."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no trace here; runs record one since trace replay landed "
                         "(run the benchmark again to record it)")
    raw = path.read_bytes()
    text, truncated, _ = _members(raw)
    lines = text.decode(errors="replace").split("\n")
    if lines and lines[-1]:
        truncated = True  # a line cut off mid-way
    lines = lines[:-1]
    if not lines:
        raise ValueError(f"{path}: empty trace")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line 1 is not JSON ({err})") from err
    if header.get("t") != "h" or header.get("version") != VERSION:
        raise ValueError(f"{path}: line 1 is not a version-{VERSION} trace header")
    trace = Trace(header, truncated=truncated)
    for n, line in enumerate(lines[1:], start=2):
        try:
            trace.add(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: line {n} is not a trace entry ({err})") from err
    return trace


def _members(raw: bytes) -> tuple[bytes, bool, int]:
    """The text of the complete gzip members, whether a last one was cut off, and the bytes
    the complete ones take."""
    out, pos = [], 0
    while pos < len(raw):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(raw[pos:])
        except zlib.error:
            return b"".join(out), True, pos
        if not d.eof:
            return b"".join(out), True, pos
        out.append(chunk)
        pos = len(raw) - len(d.unused_data)
    return b"".join(out), False, pos
