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
    """A pass without Python's automatic collections, each a stop of the whole process in
    the middle of a step: the one collection starts where `run_variant` asks for it, a full
    one after each problem's record, when the finished problem's objects are gone and no
    step waits. The search makes no garbage cycles worth collecting sooner: on the fake
    backend at n=512 the young collections of a pass collected nothing, and on vLLM at n=64
    the full collection after a problem's record found nothing. What the young collections
    did was walk the objects the search keeps (its trees, its requests) on their way to the
    old generation: at n=512 on vLLM, 17 of about 15 ms a pass, 0.44 ms a generator step
    (from a young threshold of 20,000; from Python's 700, 1,386 a pass, 0.7 ms a step); and
    at n=512, 7 or 8 automatic full collections, 12 to 87 ms each, on a heap frozen by
    `settle_heap`. On a GPU each is a stall of several decode steps at a time the engine
    does not choose. Afterwards collection is as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
                gc.collect()  # the pass's only collection (`quiet_heap`)
                written = clock.now() - now
        finally:
            detach_counters(counters)
            if trace:
                detach_trace()
                trace.flush()
