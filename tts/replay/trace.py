"""A run's trace: what the engine saw from its two models, in `trace.jsonl.gz`.

Every generation request (its seed, its prompt as a hash and a length, the tokens it
produced, how it ended, whether the engine sent it as speculation) and every score (which
path and step, as a hash of the problem and the steps' texts, and the score returned).
The file is a series of gzip members, one per flush: the runner flushes with each record,
so a killed run keeps the trace of everything it finished, and `--resume` appends to it.
A last member cut off by a kill is dropped when read (and said), never misread.

Each time a run opens its trace (a resume too) it writes the code and the engine options
that record what follows (`tts.replay.provenance`); a replay compares them with its own.

Each request and score is recorded with its variant and each request with its place in
the order requests were sent. A replay serves each variant its own recorded outputs, the
n-th request of a (seed, prompt) the n-th recorded one (`VariantReader`): in bf16 the
same request gives other tokens in another variant (the batch moves the logits), so a
variant served another's outputs grows another tree. Only where a variant's own are
exhausted are another variant's borrowed, and only then are tokens drawn.

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
from enum import IntEnum
from pathlib import Path

from tts.backends.base import FinishReason, GenDelta, Generator, GenRequest, ScoreRequest, StepStats, Verifier
from tts.engine.model_runner import SPECULATIVE_PREFIX
from tts.replay.served import Divergence

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

    def __init__(self, path: Path, header: dict, provenance: dict | None = None) -> None:
        self.path = Path(path)
        self._sent = 0  # requests sent so far: each request's place in the order sent
        if self.path.exists():  # a resume: a member a kill cut off goes, so what follows reads
            text, _, whole = _members(self.path.read_bytes())
            with open(self.path, "r+b") as f:
                f.truncate(whole)
            self._sent = text.count(b'"t":"g"')  # a resume's requests come after the recorded ones
        fresh = not self.path.exists() or not self.path.stat().st_size
        self._lines: list[dict] = [{"t": "h", "version": VERSION, **header}] if fresh else []
        if provenance is not None:  # the code and options that record what follows (a resume's too)
            self._lines.append({"t": "p", **provenance})
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
            "spec": request.request_id.startswith(SPECULATIVE_PREFIX), "n": self._sent, "o": []}
        self._sent += 1

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
    """One recorded request's output, the variant that sent it and its place in the order
    requests were sent (the line's place, in a trace from before that was recorded)."""

    tokens: tuple[int, ...]
    finish: str  # a FinishReason value
    speculative: bool
    variant: str = field(default="", compare=False)
    order: int = field(default=0, compare=False)

    @property
    def finished(self) -> bool:
        return self.finish != FinishReason.ABORTED.value


def _best(gens: Sequence[Generation]) -> Generation | None:
    """The output that serves most: finished before aborted, then the longest (the first such)."""
    return max(gens, key=lambda g: (g.finished, len(g.tokens)), default=None)


@dataclass
class Trace:
    """A trace read back: its header, the generations by (seed, prompt hash), each key's
    in the order sent, the scores by key, each key's in the order recorded, and what
    reading found. `generations` and `scores` pool the variants (the best output of a key,
    its last score); a replay reads each variant's own first (`VariantReader`)."""

    header: dict
    generations: dict[tuple[int, int], Generation] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    score_depths: dict[int, list[float]] = field(default_factory=dict)
    requests: int = 0
    truncated: bool = False  # the last member was cut off (a killed run)
    sent: dict[tuple[int, int], list[Generation]] = field(default_factory=dict)  # in the order sent
    scored: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # (variant, score) in order
    # the code and options that recorded it (`tts.replay.provenance`): one each, in the order
    # written (a resume or a merged shard on other code adds one); none before they were recorded
    provenance: list[dict] = field(default_factory=list)
    _resume: dict[tuple[str | None, int, int], tuple[Generation, int]] | None = None
    _sorted: bool = True

    def add(self, line: dict) -> None:
        if line["t"] == "g":
            new = Generation(tuple(line["o"]), line["f"], line.get("spec", False), line.get("v", ""),
                             line.get("n", self.requests))
            self.requests += 1
            key = (line["seed"], line["h"])
            old = self.generations.get(key)
            if old is None or (new.finished, len(new.tokens)) > (old.finished, len(old.tokens)):
                self.generations[key] = new
            self.sent.setdefault(key, []).append(new)
            self._sorted = False
            self._resume = None
        elif line["t"] == "s":
            self.scores[line["k"]] = line["r"]
            self.scored.setdefault(line["k"], []).append((line.get("v", ""), line["r"]))
            self.score_depths.setdefault(line["d"], []).append(line["r"])
        elif line["t"] == "p" and (p := {k: v for k, v in line.items() if k != "t"}) not in self.provenance:
            self.provenance.append(p)

    def outputs(self, seed: int, prompt_hash: int) -> list[Generation]:
        """Every recorded output of a request (seed, prompt), all variants, in the order sent."""
        if not self._sorted:
            for gens in self.sent.values():
                gens.sort(key=lambda g: g.order)
            self._sorted = True
        return self.sent.get((seed, prompt_hash), [])

    def drift(self, base: str, variant: str) -> tuple[int, int]:
        """How many requests `variant` sent with a prompt and seed `base` also sent sampled
        other tokens (over the shorter of the two outputs), of how many such requests. With
        a resumable sampler a request's tokens are a function of its prompt, seed and
        logits, so a difference is the logits moving with the batch or the prefix cache:
        numerics, not the schedule."""
        differed = shared = 0
        for gens in self.sent.values():
            mine = next((g for g in gens if g.variant == variant), None)
            theirs = next((g for g in gens if g.variant == base), None)
            if mine is None or theirs is None:
                continue
            n = min(len(mine.tokens), len(theirs.tokens))
            shared += 1
            differed += mine.tokens[:n] != theirs.tokens[:n]
        return differed, shared

    def generation(self, seed: int, prompt_hash: int, resumable: bool,
                   variant: str | None = None) -> tuple[Generation, int] | None:
        """The recorded output a request (seed, prompt) gets, and where in it the request
        starts: 0 for the request recorded itself; with a resumable sampler also a request
        whose prompt is a recorded prompt plus the first k tokens of its output. With a
        variant, its own recorded outputs first (the request's, then one it resumes), then
        any variant's."""
        for who in ((variant, None) if variant is not None else (None,)):
            gens = self.outputs(seed, prompt_hash)
            exact = _best([g for g in gens if who is None or g.variant == who])
            if exact is not None:
                return exact, 0
            if resumable and (found := self._resumes().get((who, seed, prompt_hash))) is not None:
                return found
        return None

    def _resumes(self) -> dict[tuple[str | None, int, int], tuple[Generation, int]]:
        """Each recorded prompt extended by the first k tokens of its output, by (variant,
        seed, hash) and by (None, seed, hash): the output with most left after k, and k."""
        if self._resume is None:
            self._resume = {}
            for (s, h0), gens in self.sent.items():
                for gen in gens:
                    h = h0
                    for k, token in enumerate(gen.tokens[:-1], start=1):
                        h = extend_hash(h, (token,))
                        for key in ((gen.variant, s, h), (None, s, h)):
                            old = self._resume.get(key)
                            if old is None or len(gen.tokens) - k > len(old[0].tokens) - old[1]:
                                self._resume[key] = (gen, k)
        return self._resume


class Whose(IntEnum):
    """Where a served token or score came from."""

    OWN = 0  # the variant's own recording
    BORROWED = 1  # another variant's recording of the same request
    DRAWN = 2  # neither: drawn (`tts.replay.sampler`)


class VariantReader:
    """What one replayed variant is served from a trace (module docstring): a request gets
    the variant's own recorded outputs of its (seed, prompt) in the order they were sent,
    one each (one sent as speculation preferring one recorded as such, and the same for a
    plain request); once they are all served, another variant's (the best: finished, then
    longest); then its own again (the best). A score likewise: the variant's own in order,
    then another's, then its own last. Where the variant first asks for what its own
    recording does not hold, the backends note it in `divergence`."""

    def __init__(self, trace: Trace, variant: str) -> None:
        self.trace = trace
        self.variant = variant
        self.divergence = Divergence(variant)
        self._served: set[int] = set()  # id() of own recorded outputs already served
        self._scored: dict[str, int] = {}  # own scores of a key served so far

    def take(self, seed: int, prompt_hash: int, speculative: bool) -> tuple[Generation, Whose, bool] | None:
        """The recorded output a request sent now gets, whose it is, and whether it was
        already served to an earlier request of this variant (all its own were)."""
        gens = self.trace.outputs(seed, prompt_hash)
        own = [g for g in gens if g.variant == self.variant]
        fresh = [g for g in own if id(g) not in self._served]
        if fresh:
            gen = next((g for g in fresh if g.speculative == speculative), fresh[0])
            self._served.add(id(gen))
            return gen, Whose.OWN, False
        other = _best([g for g in gens if g.variant != self.variant])
        if other is not None:
            return other, Whose.BORROWED, False
        gen = _best(own)
        return (gen, Whose.OWN, True) if gen is not None else None

    def resumed(self, seed: int, prompt_hash: int) -> tuple[Generation, int, Whose] | None:
        """A recorded output for a request (seed, prompt) under a resumable sampler, without
        taking it: a request's continuation where its output ran out, or one that resumes a
        recorded step part-way (`Trace.generation`). The variant's own first."""
        found = self.trace.generation(seed, prompt_hash, True, self.variant)
        if found is None:
            return None
        return found[0], found[1], self._whose(found[0])

    def extending(self, seed: int, prompt_hash: int, served: Sequence[int]) -> tuple[Generation, int, Whose] | None:
        """A recorded output of the request (seed, prompt) that begins with the tokens
        `served` and goes on (the best: finished, then longest), and where it goes on; the
        variant's own first."""
        n = len(served)
        longer = [g for g in self.trace.outputs(seed, prompt_hash) if len(g.tokens) > n and list(g.tokens[:n]) == served]
        gen = _best([g for g in longer if g.variant == self.variant]) or _best(longer)
        return (gen, n, self._whose(gen)) if gen is not None else None

    def _whose(self, gen: Generation) -> Whose:
        return Whose.OWN if gen.variant == self.variant else Whose.BORROWED

    def owns_score(self, key: str) -> bool:
        """Whether the variant's own recording holds a score of `key` not yet served."""
        return self._scored.get(key, 0) < sum(w == self.variant for w, _ in self.trace.scored.get(key) or [])

    def score(self, key: str) -> tuple[float, Whose] | None:
        values = self.trace.scored.get(key) or []
        own = [v for w, v in values if w == self.variant]
        n = self._scored.get(key, 0)
        if n < len(own):
            self._scored[key] = n + 1
            return own[n], Whose.OWN
        other = [v for w, v in values if w != self.variant]
        if other:
            return other[-1], Whose.BORROWED
        return (own[-1], Whose.OWN) if own else None


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
