"""The one collector that turns the engine's events (`tts.metrics.events`) into
per-problem metrics and per-model step logs (`tts.metrics.measures`).

Where one model call served several problems, the collector shares its counts out exactly
(`split_exactly`): the call's wall time goes to every problem it was charged to, its
verifier tokens and requests in proportion to the scores each problem made it compute.
"""

from __future__ import annotations

from collections.abc import Callable

from tts.metrics.events import (BeamsRejected, Event, IterationDone, ModelTime, ProblemFinished, RequestAdded,
                                ScoresMade, SearchSettled, SelectionTimed, SpeculationAdopted, SpeculationPruned,
                                SpeculativeStep, StepDone, TokensGenerated, TokensLate)
from tts.metrics.measures import ProblemMetrics, SpeculationLog, StepLog, split_exactly
from tts.metrics.work import WorkLog


class MetricsCollector:
    """Per-problem metrics and per-model step logs, from the engine's events."""

    def __init__(self) -> None:
        self.problems: dict[str, ProblemMetrics] = {}
        self.logs = {"generator": StepLog(), "verifier": StepLog()}
        self.speculation = SpeculationLog()  # the run's, both disciplines
        self.work = WorkLog()  # generation by request kind, verifier calls by purpose
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
        self.work.requests[e.kind] += 1

    def _tokens(self, e: TokensGenerated) -> None:
        m = self.problems[e.problem_id]
        m.gen_tokens += e.tokens
        self.work.tokens[e.kind] += e.tokens
        if e.speculative:
            m.spec_generated += e.tokens
            self.speculation.generated += e.tokens
        if e.prompt_tokens is not None:
            m.gen_prompt_tokens += e.prompt_tokens
            m.gen_cached_tokens += e.cached_tokens

    def _step(self, e: StepDone) -> None:
        self.logs[e.model].observe(e.stats)

    def _late(self, e: TokensLate) -> None:
        self.logs["generator"].late_tokens += e.tokens

    def _time(self, e: ModelTime) -> None:
        field = "generator_s" if e.model == "generator" else "verifier_s"
        self.logs[e.model].model_s += e.wall_s  # the variant's, once
        for pid in e.problem_ids:
            m = self.problems[pid]
            setattr(m, field, getattr(m, field) + e.wall_s)

    def _scores(self, e: ScoresMade) -> None:
        weights = {pid: c["computed"] for pid, c in e.by_problem.items()}
        self.work.calls[e.purpose] += 1
        self.work.items[e.purpose].append(e.items)
        self.work.computed[e.purpose] += sum(weights.values())
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

    def _selection(self, e: SelectionTimed) -> None:
        m = self.problems[e.problem_id]
        m.select_s += e.seconds
        m.select_max_s = max(m.select_max_s, e.seconds)

    def _adopted(self, e: SpeculationAdopted) -> None:
        self.problems[e.problem_id].spec_used += e.tokens
        self.speculation.used += e.tokens

    def _spec_step(self, e: SpeculativeStep) -> None:
        self.speculation.steps[e.outcome] += 1
        self.speculation.wasted += e.wasted

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
    StepDone: MetricsCollector._step, TokensLate: MetricsCollector._late, ModelTime: MetricsCollector._time,
    ScoresMade: MetricsCollector._scores, IterationDone: MetricsCollector._iteration,
    SelectionTimed: MetricsCollector._selection,
    SpeculationAdopted: MetricsCollector._adopted, BeamsRejected: MetricsCollector._rejected,
    SpeculationPruned: MetricsCollector._spec_pruned, SpeculativeStep: MetricsCollector._spec_step,
    SearchSettled: MetricsCollector._settled, ProblemFinished: MetricsCollector._finished,
}
