"""The engine's metric events.

The engine and its schedules never write a `ProblemMetrics` field: they emit the frozen
events below, and the one collector (`tts.metrics.collector.MetricsCollector`) attributes
each to its problems.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tts.backends.base import ScoreBatchStats, StepStats


@dataclass(frozen=True)
class RequestAdded:
    """A generation request went to the backend."""

    problem_id: str
    kind: str


@dataclass(frozen=True)
class TokensGenerated:
    """Tokens from one generator step, summed over a problem's requests of one `kind`
    (`RequestKind`) that were speculative or not; `prompt_tokens` and `cached_tokens`, over
    those whose first delta this was (None: none was)."""

    problem_id: str
    tokens: int
    speculative: bool
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    kind: str = "fresh"


@dataclass(frozen=True)
class StepDone:
    """One engine step of a model (`generator` or `verifier`)."""

    model: str
    stats: StepStats


@dataclass(frozen=True)
class TokensLate:
    """Late tokens an abort cost (`Generator.abort`): with overlap, the tokens of stopped
    requests that were already in the step in flight, computed and thrown away."""

    tokens: int


@dataclass(frozen=True)
class ModelTime:
    """Wall time one model spent on work the given problems waited for."""

    model: str
    problem_ids: tuple[str, ...]
    wall_s: float


@dataclass(frozen=True)
class ScoresMade:
    """One verifier call for `purpose` (`Purpose`) on `items` beams: its counters per
    problem (`requested`, `computed`, `lookahead`), and its backend batches."""

    by_problem: Mapping[str, Counter]
    batches: Sequence[ScoreBatchStats]
    purpose: str = "select"
    items: int = 0


@dataclass(frozen=True)
class IterationDone:
    """A problem's search iteration: the new tokens of each of its steps."""

    problem_id: str
    step_lengths: tuple[int, ...]


@dataclass(frozen=True)
class SelectionTimed:
    """A problem's selection, timed on the host once per iteration (`Inflight.select`: the
    policy's cut, the iteration's bookkeeping, early exit's check; not what the discipline
    does with the new frontier after it)."""

    problem_id: str
    seconds: float


@dataclass(frozen=True)
class SpeculationAdopted:
    """Speculative tokens that became part of a problem's real steps."""

    problem_id: str
    tokens: int


@dataclass(frozen=True)
class SpeculativeStep:
    """What became of a speculative step (`tts.engine.speculation.steps`): adopted by its kept
    child (`whole`, `promoted`, `partial`, `discarded`), `dropped` (no kept child took it),
    `preempted` (stopped to make room; it may resume), or `reset` (preempted where sampling
    is not resumable: its tokens are thrown away); `wasted` of its tokens go unused."""

    problem_id: str
    outcome: str
    wasted: int = 0


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


Event = (RequestAdded | TokensGenerated | StepDone | TokensLate | ModelTime | ScoresMade | IterationDone | SelectionTimed
         | SpeculationAdopted | SpeculativeStep | BeamsRejected | SpeculationPruned | SearchSettled
         | ProblemFinished)
