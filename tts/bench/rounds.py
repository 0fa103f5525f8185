"""The order a run's variants take turns in: rounds of problems (`rounds`), each variant in
its turn (`in_turn`), and the interim summaries written as they end (`Interim`).

Variants take turns in one process, over the same problems with the same seeds, sharing
the loaded models: round by round, in the listed order and then reversed (`bench.order`),
so that a machine's drift over a long run does not land on the later variants.
"""

from __future__ import annotations

import logging
import time

from tts.config.enums import VariantOrder
from tts.results.store import RunStore
from tts.results.summary import write_summary

log = logging.getLogger(__name__)


def chunked(problems: list, size: int) -> list[list]:
    """`problems` in chunks of `size` (`bench.chunk`; 0: one chunk), in their order."""
    return [problems[i:i + size] for i in range(0, len(problems), size)] if size else [problems]


def rounds(problems: list, bench) -> list[list]:
    """The run's rounds: every variant runs a round's problems before the next round starts.
    A round is a chunk (`bench.chunk`); without chunks, the variants interleave one problem
    at a time at concurrency 1 (a problem starts on cold caches then, so its record is the
    same whichever variant ran before), and take the whole selection as one round with
    problems in flight together (rounds that short would be all ramp and tail: set
    `bench.chunk` to interleave a throughput run)."""
    if bench.chunk:
        return chunked(problems, bench.chunk)
    if bench.order is VariantOrder.interleaved and bench.concurrency == 1:
        return chunked(problems, 1)
    return [problems]


def in_turn(variants: list, r: int, order: VariantOrder) -> list:
    """The variants in the order they run in round `r`: as listed, and with `interleaved`
    reversed in every odd round (A B C, C B A, A B C ...). Over two rounds each variant's
    mean position is the same, so a drift of the machine's speed that is linear over them
    weighs on every variant alike; and a variant runs twice in a row at each turn, which
    spares an engine rebuild where two variants' engines differ."""
    return variants[::-1] if order is VariantOrder.interleaved and r % 2 else list(variants)


def chunks_left(chunks: list[list], c: int, noun: str = "chunk") -> list[str]:
    """The chunks (or rounds) after the `c`-th (numbered from 0), in words; none when it is
    the last."""
    left = chunks[c + 1:]
    if not left:
        return []
    which = f"{noun} {c + 2}" if len(left) == 1 else f"{noun}s {c + 2}-{len(chunks)}"
    return [f"{which} of {len(chunks)} ({sum(map(len, left))} problems)"]


class Interim:
    """The summaries written while a run goes on (`_interim_summary`): after every variant of
    the first round, then at a round's end, each chunk's (`every_round`) or, with rounds of
    one problem, at most once a minute of real time (a summary's intervals take a second or
    two; a run of many short rounds would spend its time on them)."""

    EVERY_S = 60.0

    def __init__(self, store: RunStore, step_logs: dict[str, dict], host: dict, every_round: bool) -> None:
        self.store, self.step_logs, self.host, self.every_round = store, step_logs, host, every_round
        self.last = time.monotonic()

    def write(self, names: list[str], pending: list[str], first_round: bool = False) -> None:
        now = time.monotonic()
        if first_round or self.every_round or now - self.last >= self.EVERY_S:
            _interim_summary(self.store, names, self.step_logs, self.host, pending)
            self.last = time.monotonic()


def _interim_summary(store: RunStore, names: list[str], step_logs: dict[str, dict], host: dict,
                     pending: list[str]) -> None:
    """The summary of the variants run so far, written as each one ends, so a run that takes
    many sessions of `--resume` (or is killed) keeps its finished variants' tables; it names
    the variants (and `bench.chunk`'s chunks) still to run, and leaves the plots to the
    run's last summary. A failure here is logged, not raised: the run goes on, and its last
    summary raises it."""
    try:
        write_summary(store, names, step_logs, host, pending=pending, plots=False)
    except Exception as err:  # noqa: BLE001 (the run's records matter more than an interim table)
        log.warning("interim summary after %s not written: %s", names[-1], err)
