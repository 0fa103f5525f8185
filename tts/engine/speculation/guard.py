"""Whether the decoupled schedule's speculation pays, by the run's own cost model.

A speculative token takes a free batch slot, and costs what one more sequence in a decode
step costs (`b` of the step cost model, `tts.metrics.cost_model`): every request in that
step waits that much longer. Adopted, it saves the real token its own `b` and its share
of a step, `a / B` for the B real requests a step runs. So speculation pays while

    hit rate x (b + a / B) > b,   i.e.   hit rate > b / (b + a / B)

On a GPU, where `b` is a fraction of a percent of `a`, nearly any hit rate pays; on a CPU
in float32, where `b` is 7% of `a`, it takes about half the speculative tokens adopted.
The guard fits `a` and `b` on the generator's steps as they come (every `REFIT_STEPS`),
measures the hit rate on the speculative tokens settled so far (adopted or wasted), and
stops new speculation while it does not pay, so the schedule falls back to the
baseline's work; every `PROBE_EVERY` steps off it lets speculation run `PROBE_FOR` steps
to measure again.
"""

from __future__ import annotations

from dataclasses import replace

from tts.backends.base import StepStats
from tts.metrics.cost_model import CostModel, CostSums, fit
from tts.metrics.measures import SpeculationLog

MIN_EVIDENCE = 256  # speculative tokens settled before the guard judges
MIN_R2 = 0.5  # a fit that explains less of the steps' time is not trusted
# nor one whose step costs less than a model's step could: the fake backend's microseconds
# of Python must not steer its deterministic tests
MIN_STEP_S = 1e-3
REFIT_STEPS = 64
PROBE_EVERY, PROBE_FOR = 256, 32


class SpeculationGuard:
    """Judges speculation by hit rate against the cost model's break-even (module docstring).
    `cost` fixes the cost model instead of fitting it (tests)."""

    def __init__(self, log: SpeculationLog, cost: CostModel | None = None, min_evidence: int = MIN_EVIDENCE) -> None:
        self.log = log
        self.min_evidence = min_evidence
        self._fixed = cost is not None
        self._model = cost
        self._sums = CostSums()
        self._batch = 0.0  # moving mean of real requests per generator step
        self._off = 0  # consecutive steps judged not paying
        self.off_steps = 0  # all such steps

    def observe(self, st: StepStats, real: int) -> None:
        """After a generator step that ran `real` real requests; priced where the run is
        recorded for a card (`StepStats.card_s`) as that card's step."""
        self._sums.observe(st if st.card_s is None else replace(st, wall_s=st.card_s))
        if not self._fixed and self._sums.steps % REFIT_STEPS == 0:
            self._model = fit(self._sums)
        self._batch = 0.9 * self._batch + 0.1 * real if self._batch else float(real)
        if self.paying():
            self._off = 0
        else:
            self._off += 1
            self.off_steps += 1

    def breakeven(self) -> float | None:
        """The hit rate above which a speculative token pays; None before a fit that
        explains the steps' time (r2 at least `MIN_R2`) of a real model (`MIN_STEP_S`)."""
        m = self._model
        if m is None or m.r2 < MIN_R2 or m.step_s + m.per_decode_seq_s < MIN_STEP_S:
            return None
        if m.per_decode_seq_s <= 0:
            return 0.0
        return m.per_decode_seq_s / (m.per_decode_seq_s + m.step_s / max(1.0, self._batch))

    def hit_rate(self) -> float | None:
        """Adopted over settled speculative tokens; None before `min_evidence` settled."""
        settled = self.log.used + self.log.wasted
        return self.log.used / settled if settled >= self.min_evidence else None

    def paying(self) -> bool:
        hit, even = self.hit_rate(), self.breakeven()
        return hit is None or even is None or hit > even

    def allows(self) -> bool:
        """New speculation may start: it pays, or a probe measures it again."""
        probing = self._off >= PROBE_EVERY and self._off % PROBE_EVERY < PROBE_FOR
        return self._off == 0 or probing

    def summary(self) -> dict:
        return {"spec_breakeven": self.breakeven(), "spec_guard_hit_rate": self.hit_rate(),
                "spec_guard_off_steps": self.off_steps}
