"""The messages between a schedule and the engine's step loop: the next step is one
generator step (`Generate`) or one verifier call (`Score`), and a verifier call says what
it is for (`Purpose`), so the schedule that asked dispatches its result on the message."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from tts.engine.scoring import ScoreItem


@dataclass(frozen=True)
class Generate:
    """The next engine step is one generator step."""


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
