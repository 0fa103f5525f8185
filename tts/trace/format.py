"""The trace format: what the engine saw from its two models, in `trace.jsonl.gz`, and
reading it back (`read_trace`).

Every generation request (its seed, its prompt as a hash and a length, the tokens it
produced, how it ended, whether the engine sent it as speculation) and every score (which
path and step, as a hash of the problem and the steps' texts, and the score returned),
each with its variant and each request with its place in the order requests were sent.
The file is a series of gzip members, one per flush (`tts.trace.recorder`); a last member
cut off by a kill is dropped when read (and said), never misread. Each time a run opens
its trace it writes the code and engine options that record what follows
(`tts.trace.provenance`).

Prompts are keyed by a polynomial rolling hash of their token ids, so that the key of a
prompt extended by some of a recorded request's output is computed from the recorded
prompt's key: a replay with a resumable sampler (`generator.sampler=position`) finds the
rest of a step it resumes in the request that first sampled it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tts.backends.base import FinishReason
from tts.token_hash import extend_hash

TRACE = "trace.jsonl.gz"
VERSION = 1


def score_key(problem: str, steps: Sequence[str]) -> str:
    """The key of the score of a path's last step (`steps` up to and including it)."""
    return hashlib.blake2b(json.dumps([problem, *steps]).encode(), digest_size=10).hexdigest()


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


def best_output(gens: Sequence[Generation]) -> Generation | None:
    """The output that serves most: finished before aborted, then the longest (the first such)."""
    return max(gens, key=lambda g: (g.finished, len(g.tokens)), default=None)


@dataclass
class Trace:
    """A trace read back: its header, the generations by (seed, prompt hash), each key's
    in the order sent, the scores by key, each key's in the order recorded, and what
    reading found. `generations` and `scores` pool the variants (the best output of a key,
    its last score); a replay reads each variant's own first (`tts.replay.reader`)."""

    header: dict
    generations: dict[tuple[int, int], Generation] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    score_depths: dict[int, list[float]] = field(default_factory=dict)
    requests: int = 0
    truncated: bool = False  # the last member was cut off (a killed run)
    sent: dict[tuple[int, int], list[Generation]] = field(default_factory=dict)  # in the order sent
    scored: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # (variant, score) in order
    # the code and options that recorded it (`tts.trace.provenance`): one each, in the order
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
                   variant: str | None = None, own_only: bool = False) -> tuple[Generation, int] | None:
        """The recorded output a request (seed, prompt) gets, and where in it the request
        starts: 0 for the request recorded itself; with a resumable sampler also a request
        whose prompt is a recorded prompt plus the first k tokens of its output. With a
        variant, its own recorded outputs first (the request's, then one it resumes), then
        any variant's (none with `own_only`)."""
        whose = (variant,) if own_only else (variant, None) if variant is not None else (None,)
        for who in whose:
            gens = self.outputs(seed, prompt_hash)
            exact = best_output([g for g in gens if who is None or g.variant == who])
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


def read_trace(path: Path) -> Trace:
    """Read a trace file; ValueError naming the file when it is not one."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no trace here; runs record one since trace replay landed "
                         "(run the benchmark again to record it)")
    raw = path.read_bytes()
    text, truncated, _ = complete_members(raw)
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


def complete_members(raw: bytes) -> tuple[bytes, bool, int]:
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
