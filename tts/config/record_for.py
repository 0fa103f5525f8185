"""`bench.record_for`: the card and the model pair a run's engine decisions are priced for
(`tts.assembly.card`). The run still computes every token and score on its own models; the
speculation width, the speculation guard's step prices, the KV budget (counted in the
pair's tokens on that card), the memory split and the batch caps are those the card would
take with that pair, so a replay of the trace there re-decides what it recorded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("device", "generator", "verifier")


def group_choices(group: str) -> list[str]:
    """The options of a config group (`conf/<group>/*.yaml`)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@dataclass
class RecordFor:
    """The card and pair, by their config group options (as `tts replay RUN device=...
    generator=... verifier=...` names them); all null: decisions priced on this host."""

    device: str | None = None  # a conf/device profile, e.g. rtx4090
    generator: str | None = None  # a conf/generator option, e.g. qwen2.5-math-7b; null: the run's own
    verifier: str | None = None  # a conf/verifier option, e.g. skywork_1.5b; null: the run's own

    def __post_init__(self) -> None:
        for group in GROUPS:
            name = getattr(self, group)
            if name is not None and name not in (valid := group_choices(group)):
                raise ValueError(f"bench.record_for.{group}: {name!r}; valid choices: {', '.join(valid)}")
        if self.device is None and (self.generator or self.verifier):
            raise ValueError("bench.record_for.device: null, yet a generator or verifier is named; name the card "
                             f"(valid choices: {', '.join(group_choices('device'))})")

    def overrides(self) -> list[str]:
        """The group choices that name the card and pair (`device=rtx4090`, ...)."""
        return [f"{group}={getattr(self, group)}" for group in GROUPS if getattr(self, group) is not None]
