"""The scheduling disciplines by name: the registry the engine builds its schedule from."""

from __future__ import annotations

from tts.engine.barrier import BarrierSchedule
from tts.engine.decoupled import DecoupledSchedule
from tts.engine.inflight import ScheduleParts
from tts.engine.schedule import Schedule

SCHEDULES: dict[str, type[Schedule]] = {"barrier": BarrierSchedule, "decoupled": DecoupledSchedule}


def make_schedule(name: str, parts: ScheduleParts) -> Schedule:
    """The schedule named `name`, working with `parts`."""
    if name not in SCHEDULES:
        raise ValueError(f"engine schedule: unknown {name!r}; valid choices: {', '.join(SCHEDULES)}")
    return SCHEDULES[name](parts)
