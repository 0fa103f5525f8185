"""The messages between a schedule and the engine's step loop: the next step is one
generator step (`Generate`), with the changes to the generator's batch the schedule made
since the last one (`StepPlan`), or one verifier call (`Score`), and a verifier call says
what it is for (`Purpose`), so the schedule that asked dispatches its result on the
message."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from tts.backends.base import GenRequest
from tts.engine.scoring import ScoreItem

@dataclass(frozen=True)
class Stop:
    """A plan's call: stop these backend requests, in one call."""

    request_ids: list[str]


@dataclass(frozen=True)
class ResetPrefixCache:
    """A plan's call: empty the generator's prefix cache (a problem that starts alone)."""


@dataclass
class StepPlan:
    """The changes to the generator's batch before its next step, in the order the schedule
    made them (vLLM's `SchedulerOutput`, as new and finished requests): requests to send
    (`GenRequest`), requests to stop (`Stop`), an emptied prefix cache. The model runner
    writes it as the schedule submits and stops (the requests' states change at once, so
    the schedule reads the batch it is making) and runs it before the step; the backend
    sees none of it before."""

    calls: list[GenRequest | Stop | ResetPrefixCache] = field(default_factory=list)

    def sent(self) -> list[GenRequest]:
        """The requests it sends, in order."""
        return [c for c in self.calls if isinstance(c, GenRequest)]

    def stopped(self) -> list[str]:
        """The request ids it stops, in order."""
        return [rid for c in self.calls if isinstance(c, Stop) for rid in c.request_ids]


@dataclass(frozen=True)
class Generate:
    """The next engine step is one generator step, after `plan`."""

    plan: StepPlan = field(default_factory=StepPlan)


class Purpose(str, enum.Enum):
    """What a verifier call is for: the schedule that asked dispatches its result on it."""

    SELECT = "select"  # the scores a selection reads
    LOOKAHEAD = "lookahead"  # the kept beams' next steps, scored ahead (barrier, scope `kept`)
    REJECT = "reject"  # steps as they stand, mid-generation (early rejection)
    PRUNE = "prune"  # finished steps, mid-generation (speculation pruning)


@dataclass(frozen=True)
class Score:
    """The next engine step is one verifier call, for `purpose`; its wall time is charged
    to `charge`."""

    items: Sequence[ScoreItem]
    charge: tuple[str, ...]
    purpose: Purpose = Purpose.SELECT
