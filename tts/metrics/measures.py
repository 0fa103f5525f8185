"""Per-problem and per-run metrics: goodput, latency split, cache hits, batch utilisation.

Precise goodput follows FlashTTS: the mean token length of the final beams divided by
their mean completion time (seconds from the problem's start until the beam completed).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field

from tts import clock
from tts.backends.base import StepStats
from tts.metrics.cost_model import COST, CostSums

UTIL_BINS = 10  # batch utilisation histogram: [0, 0.1), ..., [0.9, 1.0]


def split_exactly(total: int, weights: dict) -> dict:
    """`total` shared out in proportion to `weights` as integers that add up to `total`
    (largest remainders first; equal shares when every weight is 0)."""
    if not weights:
        return {}
    w = weights if any(weights.values()) else dict.fromkeys(weights, 1)
    whole = sum(w.values())
    shares = {k: total * v // whole for k, v in w.items()}
    left = total - sum(shares.values())
    for k in sorted(w, key=lambda k: -(total * w[k] % whole))[:left]:
        shares[k] += 1
    return shares


def _mean(xs) -> float:
    xs = list(xs)
    return float(statistics.fmean(xs)) if xs else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def hit_rate(used: float, made: float) -> float | None:
    """Used over made ahead; None (not applicable, not a rate of 0) when nothing was made."""
    return used / made if made else None


@dataclass
class ProblemMetrics:
    """Everything measured while one problem ran."""

    problem_id: str
    started: float = field(default_factory=clock.now)
    latency_s: float = 0.0
    generator_s: float = 0.0
    verifier_s: float = 0.0
    iterations: int = 0
    gen_tokens: int = 0  # tokens the generator produced, speculative included
    gen_prompt_tokens: int = 0
    gen_cached_tokens: int = 0
    gen_requests: int = 0
    ver_prompt_tokens: int = 0
    ver_cached_tokens: int = 0
    ver_requests: int = 0
    scores_requested: int = 0
    scores_computed: int = 0
    score_cache_hits: int = 0
    lookahead_scored: int = 0  # speculative next steps scored ahead (lookahead verification)
    lookahead_used: int = 0  # of those, scores a later iteration read instead of computing
    spec_generated: int = 0
    spec_used: int = 0
    spec_pruned_beams: int = 0  # speculation pruning: beams whose speculation stopped
    spec_pruned_requests: int = 0  # their speculative requests stopped (or kept from a slot)
    partial_scored: int = 0  # early rejection: partial steps scored
    beams_rejected: int = 0  # early rejection: beams whose step was stopped
    reject_tokens_saved: int = 0  # their steps' estimated remaining tokens (the iteration's mean step)
    rejected_above_cut: int = 0  # rejected beams whose estimate ended above selection's cut
    settled_at: int | None = None  # early exit: the iteration after which the search stopped
    select_s: float = 0.0  # host time in selection, every iteration's (`SelectionTimed`)
    select_max_s: float = 0.0  # the longest one
    step_tokens_mean: list[float] = field(default_factory=list)  # per iteration
    step_tokens_max: list[int] = field(default_factory=list)
    beam_tokens: list[int] = field(default_factory=list)  # final candidates
    beam_completion_s: list[float] = field(default_factory=list)

    def elapsed(self) -> float:
        return clock.now() - self.started

    @property
    def precise_goodput(self) -> float:
        return _ratio(_mean(self.beam_tokens), _mean(self.beam_completion_s))

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("started")
        out["precise_goodput"] = self.precise_goodput
        out["gen_cache_hit_rate"] = _ratio(self.gen_cached_tokens, self.gen_prompt_tokens)
        out["ver_cache_hit_rate"] = _ratio(self.ver_cached_tokens, self.ver_prompt_tokens)
        out["spec_wasted"] = self.spec_generated - self.spec_used
        out["spec_hit_rate"] = hit_rate(self.spec_used, self.spec_generated)
        out["lookahead_hit_rate"] = hit_rate(self.lookahead_used, self.lookahead_scored)
        out["straggler_gap"] = _mean(m / a for m, a in zip(self.step_tokens_max, self.step_tokens_mean) if a)
        return out


@dataclass
class SpeculationLog:
    """A run's speculative work, for either discipline: tokens generated speculatively,
    adopted into real steps (`used`), and thrown away once settled (`wasted`: dropped,
    reset, or the part of an adopted step its child did not take); speculative steps by
    what became of them (`tts.metrics.events.SpeculativeStep`)."""

    generated: int = 0
    used: int = 0
    wasted: int = 0
    steps: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        s = self.steps
        return {"spec_generated": self.generated, "spec_used": self.used, "spec_wasted": self.wasted,
                "spec_hit_rate": hit_rate(self.used, self.generated),
                "spec_steps_whole": s["whole"], "spec_steps_promoted": s["promoted"],
                "spec_steps_partial": s["partial"], "spec_steps_discarded": s["discarded"],
                "spec_steps_dropped": s["dropped"], "spec_preempted": s["preempted"], "spec_reset": s["reset"],
                "requests_saved": s["whole"]}


@dataclass
class StepLog:
    """Per-model engine-step statistics over a run."""

    util_hist: list[int] = field(default_factory=lambda: [0] * UTIL_BINS)
    token_util_hist: list[int] = field(default_factory=lambda: [0] * UTIL_BINS)
    tokens_per_request: Counter = field(default_factory=Counter)
    steps: int = 0
    util_sum: float = 0.0
    running_sum: int = 0
    kv_trace: list[tuple[float, float]] = field(default_factory=list)  # (t, kv usage)
    util_trace: list[tuple[float, float]] = field(default_factory=list)  # (t, batch util)
    t0: float = field(default_factory=clock.now)
    # full-resolution (t since phase start, utilisation) traces of the first phases, for
    # the "utilisation within one iteration" plot
    phase_traces: list[list[tuple[float, float]]] = field(default_factory=list)
    keep_phases: int = 4
    cost: CostSums = field(default_factory=CostSums)  # the step cost model's sums
    # the model's time as the variant spent it, counted once however many problems were in
    # flight: generation phases for the generator, calls for the verifier (`ModelTime`)
    model_s: float = 0.0
    # tokens computed for requests already stopped, thrown away: overlap's price (`StepStats.late_tokens`)
    late_tokens: int = 0
    _phase_t0: float = 0.0
    _recording: bool = False

    def start_phase(self) -> None:
        """Mark the start of a generation phase (one iteration of the search)."""
        self._phase_t0 = clock.now()
        self._recording = len(self.phase_traces) < self.keep_phases
        if self._recording:
            self.phase_traces.append([])

    def observe(self, s: StepStats) -> None:
        util = min(1.0, _ratio(s.num_running, s.batch_cap))
        tok_util = min(1.0, _ratio(s.num_scheduled_tokens, s.token_cap))
        self.util_hist[min(UTIL_BINS - 1, int(util * UTIL_BINS))] += 1
        self.token_util_hist[min(UTIL_BINS - 1, int(tok_util * UTIL_BINS))] += 1
        for n, count in Counter(s.tokens_per_request).items():  # few distinct counts in 512 requests
            self.tokens_per_request[_bucket(n)] += count
        self.steps += 1
        self.util_sum += util
        self.running_sum += s.num_running
        self.late_tokens += s.late_tokens
        self.cost.observe(s)
        now = clock.now() - self.t0
        self.kv_trace.append((now, s.kv_usage))
        self.util_trace.append((now, util))
        if self._recording:
            self.phase_traces[-1].append((round(clock.now() - self._phase_t0, 4), round(util, 4)))

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "batch_util_mean": _ratio(self.util_sum, self.steps),
            "running_mean": _ratio(self.running_sum, self.steps),  # comparable across batch caps
            "batch_util_hist": self.util_hist,
            "token_util_hist": self.token_util_hist,
            "tokens_per_request_hist": dict(sorted(self.tokens_per_request.items(), key=lambda kv: _bucket_order(kv[0]))),
            "kv_usage_max": max((k for _, k in self.kv_trace), default=0.0),
            "kv_usage_mean": _mean(k for _, k in self.kv_trace),
            "util_trace": _downsample(self.util_trace),
            "phase_util_traces": self.phase_traces,
            "kv_trace": _downsample(self.kv_trace),
            COST: self.cost.to_dict(),
            "model_s": self.model_s,
            "late_tokens": self.late_tokens,
        }


def _downsample(trace: list[tuple[float, float]], points: int = 600) -> list[tuple[float, float]]:
    step = max(1, len(trace) // points)
    return [(round(t, 4), round(v, 4)) for t, v in trace[::step]]


_BUCKETS = [(1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (32, "9-32"), (128, "33-128"), (512, "129-512")]


def _bucket(n: int) -> str:
    for hi, name in _BUCKETS:
        if n <= hi:
            return name
    return ">512"


def _bucket_order(name: str) -> int:
    names = [b for _, b in _BUCKETS] + [">512"]
    return names.index(name)


def summarize_problems(problems: list[dict]) -> dict:
    """Run-level numbers from per-problem metric dicts (as written in the records)."""
    if not problems:
        return {"num_problems": 0}
    beam_tokens = [t for p in problems for t in p["beam_tokens"]]
    beam_times = [t for p in problems for t in p["beam_completion_s"]]
    total_latency = sum(p["latency_s"] for p in problems)
    gen_tokens = sum(p["gen_tokens"] for p in problems)
    keys = ["gen_prompt_tokens", "gen_cached_tokens", "ver_prompt_tokens", "ver_cached_tokens",
            "spec_generated", "spec_used", "scores_requested", "scores_computed", "score_cache_hits",
            "lookahead_scored", "lookahead_used", "gen_tokens", "gen_requests", "ver_requests",
            "partial_scored", "beams_rejected", "reject_tokens_saved", "rejected_above_cut",
            "spec_pruned_beams", "spec_pruned_requests"]
    sums = {k: sum(p.get(k, 0) for p in problems) for k in keys}
    return {
        "num_problems": len(problems),
        "precise_goodput": _ratio(_mean(beam_tokens), _mean(beam_times)),
        "latency_s_mean": _mean(p["latency_s"] for p in problems),
        "latency_s_p50": float(statistics.median(p["latency_s"] for p in problems)),
        "generator_s_mean": _mean(p["generator_s"] for p in problems),
        "verifier_s_mean": _mean(p["verifier_s"] for p in problems),
        "beam_tokens_mean": _mean(beam_tokens),
        "beam_completion_s_mean": _mean(beam_times),
        "iterations_mean": _mean(p["iterations"] for p in problems),
        "tokens_per_s": _ratio(gen_tokens, total_latency),
        "gen_cache_hit_rate": _ratio(sums["gen_cached_tokens"], sums["gen_prompt_tokens"]),
        "ver_cache_hit_rate": _ratio(sums["ver_cached_tokens"], sums["ver_prompt_tokens"]),
        "spec_hit_rate": hit_rate(sums["spec_used"], sums["spec_generated"]),
        "spec_wasted": sums["spec_generated"] - sums["spec_used"],
        # None also for records written before lookahead use was counted
        "lookahead_hit_rate": (hit_rate(sums["lookahead_used"], sums["lookahead_scored"])
                               if all("lookahead_used" in p for p in problems) else None),
        "step_tokens_mean": _mean(x for p in problems for x in p["step_tokens_mean"]),
        "step_tokens_max_mean": _mean(x for p in problems for x in p["step_tokens_max"]),
        "straggler_gap": _mean(p["straggler_gap"] for p in problems),
        # adaptive compute: the share of problems whose search stopped early, and when
        "settled_share": _mean(p.get("settled_at") is not None for p in problems),
        "settled_at_mean": _mean(p["settled_at"] for p in problems if p.get("settled_at") is not None),
        **{f"total_{k}": v for k, v in sums.items()},
    }


def merge_step_summaries(a: dict | None, b: dict) -> dict:
    """One variant's `StepLog.summary()`s from two processes (a killed run and its resume),
    as one: counts and histograms add, means are weighted by steps, traces are joined in
    time (the second starts where the first ended), the first phase traces are kept."""
    if not a or not a.get("steps"):
        return b
    if not b.get("steps"):
        return a
    na, nb = a["steps"], b["steps"]

    def weighted(key: str) -> float:
        return (a[key] * na + b[key] * nb) / (na + nb)

    def joined(key: str) -> list:
        end = a[key][-1][0] if a[key] else 0.0
        return _downsample([tuple(p) for p in a[key]] + [(t + end, v) for t, v in b[key]])

    tpr = Counter(a["tokens_per_request_hist"])
    tpr.update(b["tokens_per_request_hist"])
    return {
        "steps": na + nb,
        "batch_util_mean": weighted("batch_util_mean"),
        "running_mean": weighted("running_mean"),
        "batch_util_hist": [x + y for x, y in zip(a["batch_util_hist"], b["batch_util_hist"])],
        "token_util_hist": [x + y for x, y in zip(a["token_util_hist"], b["token_util_hist"])],
        "tokens_per_request_hist": dict(sorted(tpr.items(), key=lambda kv: _bucket_order(kv[0]))),
        "kv_usage_max": max(a["kv_usage_max"], b["kv_usage_max"]),
        "kv_usage_mean": weighted("kv_usage_mean"),
        "util_trace": joined("util_trace"),
        "phase_util_traces": (a["phase_util_traces"] + b["phase_util_traces"])[:max(4, len(a["phase_util_traces"]))],
        "kv_trace": joined("kv_trace"),
        COST: (CostSums.from_dict(a.get(COST, {})) + CostSums.from_dict(b.get(COST, {}))).to_dict(),
        "model_s": a.get("model_s", 0.0) + b.get("model_s", 0.0),
        "late_tokens": a.get("late_tokens", 0) + b.get("late_tokens", 0),
    }


def merge_step_logs(a: dict | None, b: dict) -> dict:
    """`engine.step_logs()` of one variant from two processes: the generator's and the
    verifier's step statistics merged, the KV block counts (`kv_blocks`) added up; other
    entries (the decoupled engine's counters) are the second process's."""
    out = dict(b)
    for model in ("generator", "verifier"):
        if a and model in a and model in b:
            out[model] = merge_step_summaries(a[model], b[model])
    if a and a.get(KV_BLOCKS):
        out[KV_BLOCKS] = add_counts(a[KV_BLOCKS], b.get(KV_BLOCKS, {}))
    return out


KV_BLOCKS = "kv_blocks"  # step-log entry: per model, the block pool's counts (`ThrashCounter.counts`)


def add_counts(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per-model counts of two processes (a killed run and its resume) added up."""
    out = {model: dict(counts) for model, counts in b.items()}
    for model, counts in a.items():
        mine = out.setdefault(model, {})
        for name, n in counts.items():
            mine[name] = mine.get(name, 0) + n
    return out
