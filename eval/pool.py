"""A lazily created process pool that runs functions with whole-second timeouts.

math-verify's own timeouts use ``signal.alarm``, which breaks in threads. Grading
therefore runs in worker processes; the parent waits with ``future.result(timeout)``
and, when a task overruns, kills the pool's workers and starts a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from eval._mv_worker import init_worker

TIMEOUT = object()
"""Marker placed in ``run_batch`` results for a task that exceeded its time limit."""

_LOCK = threading.Lock()
_POOL: ProcessPoolExecutor | None = None
_MAX_CRASHES = 2


def num_workers() -> int:
    """Return the worker count: ``TTS_GRADER_WORKERS`` if set, else min(4, CPU count)."""
    value = os.environ.get("TTS_GRADER_WORKERS")
    if value is None:
        return max(1, min(4, os.cpu_count() or 1))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TTS_GRADER_WORKERS must be a positive integer, got {value!r}")
    return int(value)


def get_pool() -> ProcessPoolExecutor:
    """Return the module-level pool, creating it (spawn context) on first use."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ProcessPoolExecutor(
                max_workers=num_workers(),
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_worker,
            )
        return _POOL


def _kill(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's workers (Python 3.11 has no public API for it) and shut it down."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)


def discard_pool(pool: ProcessPoolExecutor) -> None:
    """Kill ``pool`` and forget it, so that the next ``get_pool`` starts a fresh one."""
    global _POOL
    with _LOCK:
        if _POOL is pool:
            _POOL = None
    _kill(pool)


def shutdown_pool() -> None:
    """Shut the module-level pool down (if any); a later call creates a new one."""
    global _POOL
    with _LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _finished_ok(future: Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _validate_timeout(timeout_s: int) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout_s must be a whole number of seconds >= 1, got {timeout_s!r}")


def run_batch(
    fn: Callable[..., Any], args_list: Sequence[tuple[Any, ...]], timeout_s: int = 5
) -> list[Any]:
    """Run ``fn(*args)`` for every args tuple in the pool, in parallel.

    Each result is waited for at most ``timeout_s`` seconds after the previous one
    has been collected (tasks start in submission order, so a task that overruns
    has really run that long). An overrunning task gets ``TIMEOUT`` as its result;
    its pool is killed and replaced, and unfinished tasks are resubmitted. A task
    whose worker dies (for example killed for memory) is retried once on a fresh
    pool, and gets ``TIMEOUT`` if it dies again.
    """
    _validate_timeout(timeout_s)
    results: list[Any] = [None] * len(args_list)
    crashes = [0] * len(args_list)
    todo = list(range(len(args_list)))
    while todo:
        todo = _run_round(fn, args_list, todo, timeout_s, results, crashes)
    return results


def _run_round(
    fn: Callable[..., Any],
    args_list: Sequence[tuple[Any, ...]],
    todo: list[int],
    timeout_s: int,
    results: list[Any],
    crashes: list[int],
) -> list[int]:
    """Submit ``todo`` to the current pool; fill ``results``; return indices to rerun."""
    pool = get_pool()
    futures = [(i, pool.submit(fn, *args_list[i])) for i in todo]
    for position, (index, future) in enumerate(futures):
        try:
            results[index] = future.result(timeout=timeout_s)
            continue
        except TimeoutError:
            rerun = False
        except BrokenProcessPool:
            crashes[index] += 1
            rerun = crashes[index] < _MAX_CRASHES
        if not rerun:
            results[index] = TIMEOUT
        discard_pool(pool)
        retry = [index] if rerun else []
        for later_index, later in futures[position + 1 :]:
            if _finished_ok(later):
                results[later_index] = later.result()
            else:
                retry.append(later_index)
        return retry
    return []
