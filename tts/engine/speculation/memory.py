"""When memory stops speculation: one rule for both disciplines.

Memory is short when the generator's KV usage reaches `kv_spec_limit`, or when requests
have waited inside the backend for `WAIT_STEPS` generator steps running (vLLM could not
schedule them: its KV cache is full; a single such step may be only a prefill waiting for
the step's token budget). Then the discipline preempts its running speculation, and no
new speculation starts for `PAUSE_STEPS` generator steps, so that it does not start again
into the same shortage at once and be preempted again.
"""

from __future__ import annotations

from collections.abc import Callable

from tts.backends.base import StepStats
from tts.engine.options import KV_SPEC_LIMIT

WAIT_STEPS = 2  # generator steps in a row with requests queued in the backend
PAUSE_STEPS = 16  # after a preemption for memory, no new speculation for this many steps


class MemoryGuard:
    """`relieve` after every generator step (the one sequence both disciplines follow:
    `observe`, then preempt running speculation where memory is `short`, and the pause);
    `allows` says when new speculation may start."""

    def __init__(self, kv_spec_limit: float = KV_SPEC_LIMIT) -> None:
        self.kv_spec_limit = kv_spec_limit
        self.kv_usage = 0.0
        self._waiting = 0  # consecutive steps with requests queued in the backend
        self._pause = 0  # generator steps left without new speculation

    def observe(self, st: StepStats) -> None:
        """After a generator step: its KV usage, and whether the backend queued requests."""
        self.kv_usage = st.kv_usage
        self._waiting = self._waiting + 1 if st.num_waiting > 0 else 0
        self._pause = max(0, self._pause - 1)

    def short(self) -> bool:
        """Memory is short: running speculation must stop."""
        return self.kv_usage >= self.kv_spec_limit or self._waiting >= WAIT_STEPS

    def allows(self) -> bool:
        """New speculation may start."""
        return self._pause == 0 and not self.short()

    def preempted(self) -> None:
        """Speculation was stopped for memory: none starts for `PAUSE_STEPS` steps."""
        self._pause = PAUSE_STEPS

    def relieve(self, st: StepStats, running: int, preempt: Callable[[], object]) -> bool:
        """After a generator step (`st`) with `running` speculative requests: where memory
        is short, `preempt()` stops them all, and no new speculation starts for a while.
        True when it did."""
        self.observe(st)
        if not (running and self.short()):
            return False
        preempt()
        self.preempted()
        return True
