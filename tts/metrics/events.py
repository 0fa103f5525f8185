"""The engine's metric events, and the one collector that turns them into per-problem metrics.

The engine and its schedules never write a `ProblemMetrics` field: they emit the frozen
events below, and `MetricsCollector.emit` attributes each to its problems. Where one
model call served several problems, the collector shares its counts out exactly
(`split_exactly`): the call's wall time goes to every problem it was charged to, its
verifier tokens and requests in proportion to the scores each problem made it compute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tts.backends.base import ScoreBatchStats, StepStats
from tts.metrics.collector import ProblemMetrics, StepLog, split_exactly


@dataclass(frozen=True)
class RequestAdded:
    """A generation request went to the backend."""

    problem_id: str
    kind: str


@dataclass(frozen=True)
class TokensGenerated:
    """One request's tokens from one generator step (the prompt's, on its first)."""

    problem_id: str
    tokens: int
    speculative: bool
    prompt_tokens: int | None = None
    cached_tokens: int = 0


@dataclass(frozen=True)
class StepDone:
    """One engine step of a model (`generator` or `verifier`)."""

    model: str
    stats: StepStats


@dataclass(frozen=True)
class ModelTime:
    """Wall time one model spent on work the given problems waited for."""

    model: str
    problem_ids: tuple[str, ...]
    wall_s: float


@dataclass(frozen=True)
class ScoresMade:
    """One verifier call: its counters per problem (`requested`, `computed`, `lookahead`),
    and its backend batches."""

    by_problem: Mapping[str, Counter]
    batches: Sequence[ScoreBatchStats]


@dataclass(frozen=True)
class IterationDone:
    """A problem's search iteration: the new tokens of each of its steps."""

    problem_id: str
    step_lengths: tuple[int, ...]


@dataclass(frozen=True)
class SpeculationAdopted:
    """Speculative tokens that became part of a problem's real steps."""

    problem_id: str
    tokens: int


@dataclass(frozen=True)
class BeamsRejected:
    """Early rejection in one iteration: beams stopped, the tokens their steps would
    still have taken (estimated), and how many of them ended above selection's cut."""

    problem_id: str
    beams: int
    tokens_saved: int
    above_cut: int = 0


@dataclass(frozen=True)
class SpeculationPruned:
    """Speculation pruning in one iteration: beams whose finished step, scored early,
    cannot make selection's cut, and the speculative requests of theirs that stopped."""

    problem_id: str
    beams: int
    requests: int


@dataclass(frozen=True)
class SearchSettled:
    """Early exit: the problem's search stopped after this iteration."""

    problem_id: str
    iteration: int


@dataclass(frozen=True)
class ProblemFinished:
    """A problem's final candidates: their tokens and completion times, and what its
    score cache served."""

    problem_id: str
    latency_s: float
    beam_tokens: tuple[int, ...]
    beam_completion_s: tuple[float, ...]
    score_cache_hits: int = 0
    lookahead_used: int = 0


Event = (RequestAdded | TokensGenerated | StepDone | ModelTime | ScoresMade | IterationDone
         | SpeculationAdopted | BeamsRejected | SpeculationPruned | SearchSettled
         | ProblemFinished)


class MetricsCollector:
    """Per-problem metrics and per-model step logs, from the engine's events."""

    def __init__(self) -> None:
        self.problems: dict[str, ProblemMetrics] = {}
        self.logs = {"generator": StepLog(), "verifier": StepLog()}
        # progress display: (problem id, iterations done) after each of a problem's iterations
        self.on_iteration: Callable[[str, int], None] | None = None

    def start(self, problem_id: str) -> ProblemMetrics:
        """A problem starts: its metrics, read-only to everyone but this collector."""
        self.problems[problem_id] = ProblemMetrics(problem_id)
        return self.problems[problem_id]

    def emit(self, event: Event) -> None:
        _HANDLERS[type(event)](self, event)

    def _request(self, e: RequestAdded) -> None:
        self.problems[e.problem_id].gen_requests += 1

    def _tokens(self, e: TokensGenerated) -> None:
        m = self.problems[e.problem_id]
        m.gen_tokens += e.tokens
        if e.speculative:
            m.spec_generated += e.tokens
        if e.prompt_tokens is not None:
            m.gen_prompt_tokens += e.prompt_tokens
            m.gen_cached_tokens += e.cached_tokens

    def _step(self, e: StepDone) -> None:
        self.logs[e.model].observe(e.stats)

    def _time(self, e: ModelTime) -> None:
        field = "generator_s" if e.model == "generator" else "verifier_s"
        self.logs[e.model].model_s += e.wall_s  # the variant's, once
        for pid in e.problem_ids:
            m = self.problems[pid]
            setattr(m, field, getattr(m, field) + e.wall_s)

    def _scores(self, e: ScoresMade) -> None:
        weights = {pid: c["computed"] for pid, c in e.by_problem.items()}
        shares = [(split_exactly(b.prompt_tokens, weights), split_exactly(b.cached_tokens, weights),
                   split_exactly(b.num_requests, weights)) for b in e.batches]
        for pid, counts in e.by_problem.items():
            m = self.problems[pid]
            m.scores_requested += counts["requested"]
            m.scores_computed += counts["computed"]
            m.lookahead_scored += counts["lookahead"]
            m.partial_scored += counts["partial_scored"]
            for prompt, cached, requests in shares:
                m.ver_prompt_tokens += prompt[pid]
                m.ver_cached_tokens += cached[pid]
                m.ver_requests += requests[pid]

    def _iteration(self, e: IterationDone) -> None:
        m = self.problems[e.problem_id]
        m.iterations += 1
        if e.step_lengths:
            m.step_tokens_mean.append(sum(e.step_lengths) / len(e.step_lengths))
            m.step_tokens_max.append(max(e.step_lengths))
        if self.on_iteration:
            self.on_iteration(e.problem_id, m.iterations)

    def _adopted(self, e: SpeculationAdopted) -> None:
        self.problems[e.problem_id].spec_used += e.tokens

    def _spec_pruned(self, e: SpeculationPruned) -> None:
        m = self.problems[e.problem_id]
        m.spec_pruned_beams += e.beams
        m.spec_pruned_requests += e.requests

    def _rejected(self, e: BeamsRejected) -> None:
        m = self.problems[e.problem_id]
        m.beams_rejected += e.beams
        m.reject_tokens_saved += e.tokens_saved
        m.rejected_above_cut += e.above_cut

    def _settled(self, e: SearchSettled) -> None:
        self.problems[e.problem_id].settled_at = e.iteration

    def _finished(self, e: ProblemFinished) -> None:
        m = self.problems.pop(e.problem_id)
        m.latency_s = e.latency_s
        m.beam_tokens = list(e.beam_tokens)
        m.beam_completion_s = list(e.beam_completion_s)
        m.score_cache_hits = e.score_cache_hits
        m.lookahead_used = e.lookahead_used

    def finish(self, event: ProblemFinished) -> ProblemMetrics:
        """The problem's final metrics (it leaves the collector)."""
        m = self.problems[event.problem_id]
        self.emit(event)
        return m


_HANDLERS: dict[type, Callable[[MetricsCollector, object], None]] = {
    RequestAdded: MetricsCollector._request, TokensGenerated: MetricsCollector._tokens,
    StepDone: MetricsCollector._step, ModelTime: MetricsCollector._time,
    ScoresMade: MetricsCollector._scores, IterationDone: MetricsCollector._iteration,
    SpeculationAdopted: MetricsCollector._adopted, BeamsRejected: MetricsCollector._rejected,
    SpeculationPruned: MetricsCollector._spec_pruned,
    SearchSettled: MetricsCollector._settled, ProblemFinished: MetricsCollector._finished,
}
