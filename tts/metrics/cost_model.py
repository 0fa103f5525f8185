"""A step cost model fitted from a run's own engine steps, and the lower bound it puts on
each variant's work: how fast that work could go on this machine, however it was scheduled.

Each engine step's wall time is modelled as

    t = a + b * (decode sequences) + c * (prefill tokens)

`a` is what any step costs (for a small model's decode, reading the weights), `b` one more
sequence in a decode batch, `c` one prompt token computed. A request scheduled for one
token counts as a decode sequence, one scheduled for more as that many prefill tokens. The
fit is least squares over every step the model took in the run, all variants together
(one machine, one set of weights), kept as additive normal-equation sums (`CostSums`) so
the steps of a killed run and of its resume add up like the rest of the step log.

The bound. A schedule of the same work (the same tokens decoded and prefilled by the
generator, the same tokens prefilled by the verifier) takes at least S steps: a path's
tokens are sampled one after another, so at least L steps for a problem whose longest path
has L generated tokens (problems one at a time: their sum), and no fewer than the batch and
token caps allow. Each step costs at least `a`, so

    generator time >= a * S + b * D + c * P        verifier time >= a' * S' + c' * T

with the two models taking turns on the device, as both engines here do. Batching,
speculation that hits, lookahead, request order: none takes the same work below it. A
variant whose time sits near its bound has nothing left to gain from scheduling; one that
beats another variant's bound did other (less) work: a smaller tree, fewer prefill tokens.
The linear model ignores attention's growth with context, so the bound holds up to the
fit's error (its r2 is reported with it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tts.backends.base import StepStats


def step_features(s: StepStats) -> tuple[int, int]:
    """(decode sequences, prefill tokens) of one engine step."""
    decode = sum(1 for n in s.tokens_per_request if n == 1)
    return decode, max(0, s.num_scheduled_tokens - decode)


@dataclass
class CostSums:
    """Normal-equation sums of the step model over observed steps (additive), the steps'
    count and total wall time (for r2), and the largest batch and token caps seen (for the
    bound's fewest steps)."""

    xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    xty: list[float] = field(default_factory=lambda: [0.0] * 3)
    yy: float = 0.0
    steps: int = 0
    wall_s: float = 0.0
    batch_cap: int = 0
    token_cap: int = 0
    calls_s: float = 0.0  # host time in the backend's request calls between steps (`StepStats.calls_s`)

    def observe(self, s: StepStats) -> None:
        decode, prefill = step_features(s)
        x = (1.0, float(decode), float(prefill))
        for i in range(3):
            self.xty[i] += x[i] * s.wall_s
            for j in range(3):
                self.xtx[i][j] += x[i] * x[j]
        self.yy += s.wall_s * s.wall_s
        self.steps += 1
        self.wall_s += s.wall_s
        self.calls_s += s.calls_s
        self.batch_cap = max(self.batch_cap, s.batch_cap)
        self.token_cap = max(self.token_cap, s.token_cap)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostSums:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def __add__(self, other: CostSums) -> CostSums:
        return CostSums(
            xtx=[[a + b for a, b in zip(r, q)] for r, q in zip(self.xtx, other.xtx)],
            xty=[a + b for a, b in zip(self.xty, other.xty)], yy=self.yy + other.yy,
            steps=self.steps + other.steps, wall_s=self.wall_s + other.wall_s, calls_s=self.calls_s + other.calls_s,
            batch_cap=max(self.batch_cap, other.batch_cap), token_cap=max(self.token_cap, other.token_cap))


@dataclass(frozen=True)
class CostModel:
    """Fitted seconds per step, per decode sequence and per prefill token."""

    step_s: float
    per_decode_seq_s: float
    per_prefill_token_s: float
    steps: int  # steps fitted on
    r2: float  # share of the steps' wall-time variance the model explains

    def time(self, steps: float, decode: float, prefill: float) -> float:
        return self.step_s * steps + self.per_decode_seq_s * decode + self.per_prefill_token_s * prefill


def fit(sums: CostSums) -> CostModel | None:
    """Least squares with every coefficient >= 0: a feature whose coefficient comes out
    negative (or that never varied, e.g. no decode steps in a verifier's log) is dropped and
    the rest refitted. None: fewer than 3 steps."""
    import numpy as np

    if sums.steps < 3:
        return None
    xtx, xty = np.array(sums.xtx, dtype=float), np.array(sums.xty, dtype=float)
    active = [i for i in range(3) if xtx[i, i] > 0]
    while active:
        idx = np.ix_(active, active)
        coef, *_ = np.linalg.lstsq(xtx[idx], xty[active], rcond=None)
        if (coef >= 0).all():
            break
        active.remove(active[int(np.argmin(coef))])
    full = np.zeros(3)
    if active:
        full[active] = coef
    n = sums.steps
    mean = sums.wall_s / n
    total = sums.yy - n * mean * mean
    residual = sums.yy - 2 * full @ xty + full @ xtx @ full
    r2 = 1.0 - residual / total if total > 0 else 0.0
    return CostModel(*(float(v) for v in full), steps=n, r2=float(r2))


def min_steps(critical_path: int, decode: int, prefill: int, batch_cap: int = 0, token_cap: int = 0) -> int:
    """The fewest steps a piece of work could take: its longest chain of sampled tokens,
    and no fewer than the batch and token caps allow (at least one step for any work)."""
    need = max(critical_path, 1 if decode or prefill else 0)
    if batch_cap:
        need = max(need, math.ceil(decode / batch_cap))
    if token_cap:
        need = max(need, math.ceil((decode + prefill) / token_cap))
    return need


@dataclass(frozen=True)
class Work:
    """A variant's work as its records count it: each model's fewest steps, decode
    sequences and prefill tokens (the verifier decodes nothing)."""

    gen_steps: int
    decode: int
    prefill: int
    ver_steps: int
    ver_prefill: int


def work_of(problems: list[dict], gen_caps: tuple[int, int] = (0, 0), ver_caps: tuple[int, int] = (0, 0),
            concurrency: int = 1, tree_only: bool = False) -> Work:
    """The problems' work (see `work_bounds`); with `tree_only`, the tree's: the
    speculative tokens no beam adopted are left out of the decoded ones."""
    def wasted(m: dict) -> int:
        return m.get("spec_generated", 0) - m.get("spec_used", 0) if tree_only else 0

    decode = sum(max(0, m["gen_tokens"] - m.get("gen_requests", 0) - wasted(m)) for m in problems)
    prefill = sum(max(0, m["gen_prompt_tokens"] - m["gen_cached_tokens"]) for m in problems)
    paths = [max(m.get("beam_tokens") or [0]) for m in problems]
    path = max(math.ceil(sum(paths) / concurrency), max(paths, default=0))
    tokens = sum(max(0, m.get("ver_prompt_tokens", 0) - m.get("ver_cached_tokens", 0)) for m in problems)
    return Work(min_steps(path, decode, prefill, *gen_caps), decode, prefill,
                min_steps(0, 0, tokens, *ver_caps), tokens)


def tail_forfeit(spans: list[tuple[float, float]], concurrency: int) -> tuple[float, float]:
    """The run's tails with problems in flight together: (seconds after a pass's last start
    during which fewer than `concurrency` were in flight, and those seconds weighted by the
    share of the slots left empty, (C - k) / C with k in flight). `spans` are the problems'
    (start, end) on the variant's wall clock. A pass ends where none is left in flight: a
    run of one pass has one tail, one of several seeds or `bench.chunk`'s chunks one each.

    The problems/min ceiling (`work_bounds` with `concurrency`) lets every problem's path
    share its steps with C - 1 others to the end; in a tail fewer are left, so the weighted
    seconds lie above the ceiling whatever the engine does inside a problem. Only the order
    of admission could shorten it, and a problem's length is not known when it starts."""
    if concurrency <= 1 or not spans:
        return 0.0, 0.0
    tail = forfeit = 0.0
    for events in _passes(spans):
        last_start = max(t for t, d in events if d > 0)
        live, t0 = 0, events[0][0]
        for t, d in events:
            if t0 >= last_start and 0 < live < concurrency:
                tail += t - t0
                forfeit += (t - t0) * (concurrency - live) / concurrency
            t0, live = t, live + d
    return tail, forfeit


def _passes(spans: list[tuple[float, float]]) -> list[list[tuple[float, int]]]:
    """The problems' start (+1) and end (-1) events, split into passes: a pass ends where
    none is left in flight. At one instant an end comes before a start: a chunk's first
    problems start as its predecessor's last one ends."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    passes, current, live = [], [], 0
    for event in events:
        current.append(event)
        live += event[1]
        if live == 0:
            passes.append(current)
            current = []
    return passes


def busy_rate(spans: list[tuple[float, float]], concurrency: int) -> tuple[float, float]:
    """(seconds during which every one of `concurrency` slots held a problem, the problems
    done in them): each problem is credited with the share of its span that lay in that
    time, as if it progressed evenly. A cross-check of the rate over the wall time less the
    tails' empty share (`tail_forfeit`): that one counts a tail problem's whole latency at
    full slots, though it ran with fewer beside it and so faster; this one counts only
    full-slot time, but credits a problem that ended in a tail evenly over its span. Where
    the two agree, neither bias matters. (0, 0) with one slot, or no full-slot time."""
    if concurrency <= 1 or not spans:
        return 0.0, 0.0
    busy = done = 0.0
    for events in _passes(spans):
        live, t0, full = 0, events[0][0], []
        for t, d in events:
            if live >= concurrency and t > t0:
                full.append((t0, t))
            t0, live = t, live + d
        busy += sum(b - a for a, b in full)
        for s, e in spans:
            if e > s:
                done += sum(max(0.0, min(e, b) - max(s, a)) for a, b in full) / (e - s)
    return busy, done


def above_bound(wall_s: float, work: Work, models: dict[str, CostModel | None],
                sums: dict[str, CostSums]) -> dict[str, float] | None:
    """Where the time above the bound goes, in seconds; the parts add up to the wall time
    less the bound. With each model's steps as it took them (`sums`) against the fewest
    its work allows:

    - `host_s`: time inside no model step (Python, tokenizer, selection, statistics);
    - `gen_steps_s`, `ver_steps_s`: each model's steps beyond the fewest, `a` each
      (stragglers, barriers, batches run under-filled: the same tokens over more steps;
      for the verifier, more calls than its tokens need, as a lookahead second call makes);
    - `recomputed_s`: tokens the models computed beyond the records' work (a preempted
      request's prompt computed again, prefills repeated);
    - `residual_s`: step time the linear cost model does not explain.

    None without a fit for a model that worked."""
    parts = {"host_s": wall_s, "gen_steps_s": 0.0, "ver_steps_s": 0.0, "recomputed_s": 0.0, "residual_s": 0.0}
    for model, steps, decode, prefill in (("generator", work.gen_steps, work.decode, work.prefill),
                                          ("verifier", work.ver_steps, 0, work.ver_prefill)):
        s, m = sums.get(model), models.get(model)
        if s is None or not s.steps:
            continue
        if m is None:
            return None
        taken, decoded, prefilled = s.xtx[0]  # steps, decode sequences, prefill tokens
        parts["host_s"] -= s.wall_s
        parts[f"{model[:3]}_steps_s"] = m.step_s * (taken - steps)
        parts["recomputed_s"] += m.per_decode_seq_s * (decoded - decode) + m.per_prefill_token_s * (prefilled - prefill)
        parts["residual_s"] += s.wall_s - m.time(taken, decoded, prefilled)
    return parts


def work_bounds(problems: list[dict], gen: CostModel | None, ver: CostModel | None,
                gen_caps: tuple[int, int] = (0, 0), ver_caps: tuple[int, int] = (0, 0),
                concurrency: int = 1, tree_only: bool = False) -> dict:
    """The least generator and verifier time the problems' work takes together (module
    docstring), from their records' metrics: decode sequences are generated tokens less
    requests (a request's first token comes out of its prefill step), prefill tokens the
    uncached prompt tokens, and a problem's critical path its longest final path's
    generated tokens. With `concurrency` problems in flight at most, a step advances at
    most that many critical paths, so the steps are at least their sum over it (and the
    longest one). Caps are (batch cap, token cap) per step. None where a model that
    worked has no fit.

    `tree_only`: the bound of the tree's work alone, without the speculative tokens no
    beam adopted. A variant's own bound counts those as work, and through the batch cap
    as steps too (16 sequences a step at N=16: every 16 wasted tokens add a step), so
    speculation that is thrown away raises it: more waste, a higher bound share, and no
    faster. The tree's bound does not move with waste."""
    out: dict[str, float | None] = {"gen_bound_s": None, "ver_bound_s": None}
    w = work_of(problems, gen_caps, ver_caps, concurrency, tree_only)
    if gen is not None:
        out["gen_bound_s"] = gen.time(w.gen_steps, w.decode, w.prefill)
    if ver is not None:
        out["ver_bound_s"] = ver.time(w.ver_steps, 0, w.ver_prefill)
    elif gen is not None and not w.ver_prefill:
        out["ver_bound_s"] = 0.0  # no verifier work
    return out


COST = "cost"  # StepLog summary entry: the step log's `CostSums.to_dict()`
