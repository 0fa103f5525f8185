"""One variant's pass over its problems under one seed, each problem recorded as it
finishes: its record, the variant's step statistics and the trace, so a killed run keeps
them (`run_variant`)."""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator

from tts import clock
from tts.backends.vllm.thrash import attach_counters, detach_counters
from tts.engine.problem import ProblemInput
from tts.metrics.measures import KV_BLOCKS, merge_step_logs
from tts.results.records import build_record
from tts.results.store import RunStore
from tts.results.summary import variant_wall
from tts.wandb_sink import RunLogger
from tts.trace.recorder import TraceRecorder


# generation 2's threshold during a pass: out of reach, so no full collection starts on its own
NO_AUTOMATIC_FULL = 1 << 30
# generation 0's threshold during a pass (Python's default: 700): above the objects a step
# holds at once (a step at n=512 has a few thousand: vLLM's outputs, their deltas, the
# trace's lists), so a young collection starts only on what outlives steps, not on every step
PASS_YOUNG = 20_000


def settle_heap() -> None:
    """Before a pass's clock starts: collect what earlier passes left, and freeze what stays
    (the models, the engines, the libraries), so the pass's collections scan only what the
    search makes. vLLM's engine core freezes the heap it starts with (`freeze_gc_heap`), but
    not what comes after it (the other model, the tokenizers, the data), and an engine's
    shutdown unfreezes it all (`EngineCore.shutdown`). Unfreezing first lets the collection
    reclaim the earlier passes' engines and trees."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def quiet_heap() -> Iterator[None]:
    """A pass without Python's automatic full collections, each a stop of the whole process
    in the middle of a step: a full one starts only where `run_variant` asks for it, after
    each problem's record, when the finished problem's objects are gone and no step waits.
    At n=512 on a CPU host, on a heap frozen by `settle_heap`, Python had started 7 or 8 a
    pass over the search's live objects (vLLM's requests, the trees), 12 to 87 ms each: on
    a GPU, each a stall of several decode steps at a time the engine does not choose.
    Young collections go on (most cycles die young), from `PASS_YOUNG` objects: with
    Python's 700 a step at n=512 crossed it about twice and scanned its own short-lived
    objects each time (1,386 young collections in a pass of 660 steps, 0.7 ms a step).
    Afterwards the thresholds are as they were."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], PASS_YOUNG), thresholds[1], NO_AUTOMATIC_FULL)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def run_variant(name: str, engine, todo: list, *, store: RunStore, step_logs: dict[str, dict],
                logger: RunLogger, progress: Callable | None, trace: TraceRecorder | None,
                on_iteration: Callable[[str, str, int], None] | None = None, seed: int = 0,
                host: dict | None = None) -> None:
    """Run one variant's remaining problems under one seed (the engine's): a record (with
    its `seed`), the step statistics and the trace written as each problem finishes, so a
    killed run keeps them. The variant's wall clock and step statistics run on across its
    seeds' passes (and `bench.chunk`'s chunks). `host`: what each record says it ran on."""
    if on_iteration:
        engine.on_problem_iteration = functools.partial(on_iteration, name)
    settle_heap()  # before the variant's clock
    gold = {p.id: p for p in todo}
    # the variant's wall clock, carried across a resume by the records themselves
    start = clock.now() - variant_wall(store.records(), name)
    earlier = step_logs.get(name)  # the part of this variant a killed process ran
    # each vLLM engine's block pool: evictions and blocks recomputed after one (thrash)
    counters = attach_counters(generator=engine.gen, verifier=engine.verifier)
    if counters:
        engine.log_sources[KV_BLOCKS] = lambda: {model: c.counts() for model, c in counters.items()}
    detach_trace = trace.attach(name, engine.gen, engine.verifier) if trace else None
    written = 0.0  # the last record's writing, inside the wall time up to the next record's
    with quiet_heap():
        try:
            for outcome in engine.run([ProblemInput(p.id, p.problem) for p in todo]):
                took = clock.now()
                p = gold[outcome.problem.id]
                record = build_record(outcome, p.answer, name,
                                      {"seed": seed, "level": p.level, "subject": p.subject, "host": host})
                now = clock.now()
                # the host time of recording a problem (grading its candidates, writing it) while
                # no model step runs: its own host-time row (`tts.results.host_time`)
                record["metrics"]["record_s"] = now - took + written
                record["variant_wall_s"] = now - start
                store.append(record)
                step_logs[name] = merge_step_logs(earlier, engine.step_logs())
                store.write_step_logs(step_logs)
                if trace:
                    trace.flush()
                logger.log_problem(record)
                if progress:
                    progress(name, record)
                gc.collect()  # the pass's only full collection (`quiet_heap`)
                written = clock.now() - now
        finally:
            detach_counters(counters)
            if trace:
                detach_trace()
                trace.flush()
