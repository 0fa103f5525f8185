"""Batch-fill policies of the decoupled engine: what fills the LLM batch after real work.

Every free generator slot goes first to real work (the next step of beams whose problem
has just run its selection, and the first steps of problems already in flight). What
comes next is the policy's choice between two kinds of filler:

- eager work: start a new problem from the request queue (guaranteed useful, but a new
  prompt to prefill, and KV blocks that share nothing with the paths in flight);
- speculative work: the next step of a beam that is generated but still waits for its
  verifier score (a child's continuation), reused if the beam survives selection and
  wasted if it is pruned; it extends a cached prefix.

A policy only orders these two; it never changes what the search decides.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from tts.backends.base import StepStats


class Filler(str, enum.Enum):
    EAGER = "eager"
    SPECULATIVE = "speculative"


EAGER_FIRST = (Filler.EAGER, Filler.SPECULATIVE)
SPECULATIVE_FIRST = (Filler.SPECULATIVE, Filler.EAGER)


@dataclass(frozen=True)
class FillState:
    """What the engine knows when it fills the batch."""

    batch_cap: int
    running: int  # requests in the generator now
    util: float  # recent generator batch utilisation (moving average of running / cap)
    kv_usage: float  # the generator's KV-cache usage after its last step, in [0, 1]
    live_problems: int
    concurrency: int

    @property
    def kv_per_problem(self) -> float:
        """The measured KV share of one problem in flight (0 when none is)."""
        return self.kv_usage / self.live_problems if self.live_problems else 0.0


class FillPolicy(ABC):
    """Orders the two fillers; `observe` sees every generator step."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self.decisions: dict[str, int] = {f.value: 0 for f in Filler}

    @abstractmethod
    def choose(self, state: FillState) -> tuple[Filler, Filler]:
        """The fillers in priority order."""

    def order(self, state: FillState) -> tuple[Filler, Filler]:
        out = self.choose(state)
        self.decisions[out[0].value] += 1
        return out

    def observe(self, stats: StepStats) -> None:  # noqa: B027 - optional hook
        """See one generator step's statistics."""


class EagerFirst(FillPolicy):
    """The thesis's order: new problems first, speculation only as a last resort."""

    name = "eager_first"

    def choose(self, state: FillState) -> tuple[Filler, Filler]:
        return EAGER_FIRST


class SpeculativeFirst(FillPolicy):
    """Speculate on beams in flight before starting another problem."""

    name = "speculative_first"

    def choose(self, state: FillState) -> tuple[Filler, Filler]:
        return SPECULATIVE_FIRST


class Adaptive(FillPolicy):
    """Chooses by measured batch utilisation and KV-cache occupancy.

    Rule, evaluated at every fill:
    1. If starting one more problem would push the KV usage past `kv_threshold`
       (usage now + the measured mean usage of one problem in flight), speculate first:
       a speculative step extends a prefix already cached, a new problem brings a whole
       new prompt and its paths.
    2. Otherwise, while the batch utilisation (moving average over generator steps) is
       below `util_target`, start new problems first: the batch is short of work and
       eager work is never wasted.
    3. Otherwise (the batch is nearly full), speculate first: the few free slots cost
       one decode token per step each, and a new problem's prefill would slow the step.
    """

    name = "adaptive"

    def __init__(self, util_target: float = 0.9, kv_threshold: float = 0.8) -> None:
        super().__init__()
        self.util_target = util_target
        self.kv_threshold = kv_threshold

    def choose(self, state: FillState) -> tuple[Filler, Filler]:
        if state.kv_usage + state.kv_per_problem > self.kv_threshold:
            return SPECULATIVE_FIRST
        if state.util < self.util_target:
            return EAGER_FIRST
        return SPECULATIVE_FIRST


FILL_POLICIES: dict[str, type[FillPolicy]] = {
    cls.name: cls for cls in (EagerFirst, SpeculativeFirst, Adaptive)
}


def make_fill_policy(name: str | enum.Enum) -> FillPolicy:
    """The policy named `name` (the config's `optim.decoupled_policy`)."""
    key = getattr(name, "value", name)
    if key not in FILL_POLICIES:
        raise ValueError(f"optim.decoupled_policy: unknown {key!r}; valid choices: {', '.join(FILL_POLICIES)}")
    return FILL_POLICIES[key]()
