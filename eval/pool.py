"""A lazily created process pool that runs functions with whole-second timeouts.

math-verify's own timeouts use ``signal.alarm``, which breaks in threads. Grading
therefore runs in worker processes; the parent waits with ``future.result(timeout)``
and, when a task overruns, kills the pool's workers and starts a fresh pool.

How workers start (`start_method`): with "fork" where that is safe, i.e. on POSIX in a
process that has loaded neither torch nor vLLM and runs no other Python thread. A forked
worker does not re-import the main script, so a plain script that calls ``grade_answer``
at top level, without an ``if __name__ == "__main__":`` guard, grades once and is not run
again in every worker. Elsewhere (a process running vLLM or torch, whose threads make
``fork`` unsafe; or a platform without ``fork``) workers start with "spawn", which
re-imports the main script in each worker: there a script that grades at top level needs
that guard (console scripts such as ``tts`` and ``python -m`` modules are fine).

A spawned worker is told a start method a fresh interpreter knows (`_SpawnContext`), whatever
this process's default is: inside a launcher's worker (joblib's loky, submitit, Ray) grading
works as it does in a plain process.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext, SpawnContext, SpawnProcess
from typing import Any

from eval._mv_worker import init_worker, ready

TIMEOUT = object()
"""Marker placed in ``run_batch`` results for a task that exceeded its time limit."""

_LOCK = threading.Lock()
_POOL: ProcessPoolExecutor | None = None
_SHUT_AT_EXIT_IN: int | None = None  # the pid that registered `_shut_down_at_exit`
_MAX_CRASHES = 2
_STARTUP_TIMEOUT_S = 300


def num_workers() -> int:
    """Return the worker count: ``TTS_GRADER_WORKERS`` if set, else min(4, CPU count)."""
    value = os.environ.get("TTS_GRADER_WORKERS")
    if value is None:
        return max(1, min(4, os.cpu_count() or 1))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TTS_GRADER_WORKERS must be a positive integer, got {value!r}")
    return int(value)


_THREADED_LIBS = ("torch", "vllm")  # loaded: their native threads make fork unsafe


def start_method() -> str:
    """"fork" where it is safe (POSIX, no torch or vLLM loaded, no other Python thread),
    else "spawn" (module docstring)."""
    safe = ("fork" in multiprocessing.get_all_start_methods()
            and not any(name in sys.modules for name in _THREADED_LIBS)
            and threading.active_count() == 1)
    return "fork" if safe else "spawn"


_LAUNCH_LOCK = threading.Lock()


@contextmanager
def _default_start_method_known(method: str) -> Iterator[None]:
    """While a worker launches, make this process's default start method one that a fresh
    interpreter knows (``method`` in place of any other), and restore it after.

    A spawned child sets its parent's default start method before anything else
    (`multiprocessing.spawn.prepare`). In a joblib worker that default is "loky", which the
    child cannot find ("cannot find context for 'loky'"): it would die before running a task.
    """
    with _LAUNCH_LOCK:
        current = multiprocessing.get_start_method(allow_none=True)
        foreign = current is not None and current not in multiprocessing.get_all_start_methods()
        if foreign:
            multiprocessing.set_start_method(method, force=True)
        try:
            yield
        finally:
            if foreign:
                multiprocessing.set_start_method(current, force=True)


class _SpawnProcess(SpawnProcess):
    """A spawned worker whose start-up does not depend on this process's default start method."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with _default_start_method_known("spawn"):
            return SpawnProcess._Popen(process_obj)


class _SpawnContext(SpawnContext):
    """The "spawn" context, with workers that start in any launcher's worker (`_SpawnProcess`)."""

    Process = _SpawnProcess


def pool_context(method: str) -> BaseContext:
    """The multiprocessing context the pool's workers start with, for ``start_method()``'s
    ``method``: never this process's default context, which a launcher may have replaced."""
    return _SpawnContext() if method == "spawn" else multiprocessing.get_context(method)


def _start_pool() -> ProcessPoolExecutor:
    """Start a pool and wait until its workers run.

    Start-up (interpreter, sympy and math-verify imports: a second or more) thus
    never counts against a grading timeout.
    """
    workers = num_workers()
    method = start_method()
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=pool_context(method), initializer=init_worker
    )
    try:
        pings = [pool.submit(ready) for _ in range(workers)]
        for ping in pings:
            ping.result(timeout=_STARTUP_TIMEOUT_S)
    except (BrokenProcessPool, TimeoutError) as error:
        _kill(pool)
        hint = ('Workers use the "spawn" start method here (torch or vLLM is loaded), which '
                're-imports the main script: guard its top-level code with '
                '`if __name__ == "__main__":`, and do not run it from stdin.') if method == "spawn" else ""
        raise RuntimeError(
            f"grading worker processes failed to start (their error is printed above). {hint}"
        ) from error
    return pool


def get_pool() -> ProcessPoolExecutor:
    """Return the module-level pool, starting it (`start_method`) on first use."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = _start_pool()
            _shut_down_at_exit()
        return _POOL


def _shut_down_at_exit() -> None:
    """Shut the pool down when this process exits, before multiprocessing joins its children.

    A process that is itself a multiprocessing worker (a joblib/loky worker, for one) joins
    its children as its target returns (`multiprocessing.util._exit_function`), before the
    interpreter's own shutdown of executors: idle grading workers would be waited on forever.
    Finalizers of priority 0 or more run before that join, the highest first; the pool's own
    queues close theirs at 10 (after which no task, nor the workers' stop signal, gets through).
    """
    global _SHUT_AT_EXIT_IN
    if _SHUT_AT_EXIT_IN != os.getpid():
        multiprocessing.util.Finalize(None, shutdown_pool, exitpriority=20)
        _SHUT_AT_EXIT_IN = os.getpid()


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
    its pool is killed and replaced, and unfinished tasks are resubmitted. After a
    worker dies (for example killed for memory), the remaining tasks run one at a
    time so that the crash is blamed on the right task, which is retried once and
    then gets ``TIMEOUT``.
    """
    _validate_timeout(timeout_s)
    results: list[Any] = [None] * len(args_list)
    crashes = [0] * len(args_list)
    todo = list(range(len(args_list)))
    isolate = False
    while todo:
        batch, rest = (todo[:1], todo[1:]) if isolate else (todo, [])
        retry, crashed = _run_round(fn, args_list, batch, timeout_s, results)
        if crashed is not None and isolate:
            crashes[crashed] += 1
            if crashes[crashed] >= _MAX_CRASHES:
                results[crashed] = TIMEOUT
                retry.remove(crashed)
        isolate = isolate or crashed is not None
        todo = retry + rest
    return results


def _run_round(
    fn: Callable[..., Any],
    args_list: Sequence[tuple[Any, ...]],
    todo: list[int],
    timeout_s: int,
    results: list[Any],
) -> tuple[list[int], int | None]:
    """Run ``todo`` on the current pool, filling ``results``.

    Returns the indices to run again and the index whose wait saw the pool break
    (None if it did not).
    """
    pool = get_pool()
    futures: list[tuple[int, Future[Any]]] = []
    unsubmitted: list[int] = []
    for position, index in enumerate(todo):
        try:
            futures.append((index, pool.submit(fn, *args_list[index])))
        except BrokenProcessPool:  # a task submitted just before already killed a worker
            unsubmitted = todo[position:]
            break
    for position, (index, future) in enumerate(futures):
        try:
            results[index] = future.result(timeout=timeout_s)
            continue
        except TimeoutError:
            results[index] = TIMEOUT
            retry, crashed = [], None
        except BrokenProcessPool:
            retry, crashed = [index], index
        discard_pool(pool)
        for later_index, later in futures[position + 1 :]:
            if _finished_ok(later):
                results[later_index] = later.result()
            else:
                retry.append(later_index)
        return retry + unsubmitted, crashed
    if unsubmitted:
        discard_pool(pool)
    return unsubmitted, None
