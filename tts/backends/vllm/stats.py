"""Per-step scheduler statistics read from an in-process vLLM v1 engine.

vLLM does not hand the `SchedulerOutput` of a step back to `LLMEngine.step()`'s caller, so
the probe observes the `schedule` method of the one scheduler instance it watches
(`internals.observe_schedule`: no class is patched, other engines are untouched) and keeps
the last output. Everything else is read from the scheduler after the step:
`running`/`waiting` via `get_request_counts()`, `kv_cache_manager.usage`,
`max_num_scheduled_tokens`.

This reaches into vLLM internals (through `tts.backends.vllm.internals`), so it is enabled
only on the supported vLLM (`SUPPORTED_VLLM`, 0.32.x) and only when the scheduler has the
expected shape (`SCHEDULER_ATTRS`). Otherwise the probe degrades: running = requests that returned tokens, scheduled
tokens = tokens returned, waiting = unfinished - running, KV usage = 0.0 (unknown), and
the batch cap cannot be changed at run time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tts.backends.base import StepStats
from tts.backends.vllm.internals import (
    SUPPORTED_VLLM,
    admission_cap,
    installed_vllm_version,
    kv_usage,
    observe_schedule,
    scheduled_ids,
    scheduled_tokens,
    set_admission_cap,
    stats_scheduler,
    token_budget,
    waiting_requests,
)

if TYPE_CHECKING:  # pragma: no cover
    import vllm

logger = logging.getLogger(__name__)



class SchedulerProbe:
    """Reads what each step of one engine did; see the module docstring for how."""

    def __init__(self, llm: vllm.LLM) -> None:
        sched_config = llm.llm_engine.vllm_config.scheduler_config
        self.max_num_seqs: int = int(sched_config.max_num_seqs)
        self._token_cap = int(sched_config.max_num_batched_tokens)
        self._last: Any = None
        self._scheduler = stats_scheduler(llm)
        if self._scheduler is None:
            logger.warning("vLLM %s: scheduler stats degrade to counts from the outputs "
                           "(tested: %s.x)", installed_vllm_version(), SUPPORTED_VLLM)
            return
        self._token_cap = token_budget(self._scheduler)
        observe_schedule(self._scheduler, self._keep)

    @property
    def exact(self) -> bool:
        """True when stats come from the scheduler itself (not derived from outputs)."""
        return self._scheduler is not None

    def _keep(self, output: Any) -> None:
        self._last = output

    @property
    def batch_cap(self) -> int:
        if self._scheduler is None:
            return self.max_num_seqs
        return admission_cap(self._scheduler)

    def set_batch_cap(self, cap: int) -> None:
        """Admit at most `cap` running requests from the next step on.

        vLLM 0.32 separates admission (`max_num_active_reqs`) from the model runner's slots
        (`max_num_running_reqs`, sized at start-up to `max_num_seqs`); only admission is
        changed, so the cap can go down or back up to `max_num_seqs`, never above. Lowering
        it preempts nothing: requests already running finish, and new ones wait until the
        running count is below the cap.
        """
        if not 1 <= cap <= self.max_num_seqs:
            raise ValueError(f"batch_cap: {cap} outside [1, max_num_seqs={self.max_num_seqs}] "
                             "(the engine's slots are fixed when it starts)")
        if self._scheduler is None or not set_admission_cap(self._scheduler, cap):
            logger.warning("batch cap cannot be changed on this vLLM; it stays %d",
                           self.batch_cap)

    def in_flight(self) -> frozenset[str]:
        """The requests the last step scheduled. With asynchronous scheduling that batch is
        still running when `step()` returns (it returned the one before): a request among
        them that stops now has a token computed and thrown away. Empty when degraded."""
        return scheduled_ids(self._last) if self._scheduler is not None else frozenset()

    def begin_step(self) -> None:
        """Forget the previous step's schedule (a step with no work schedules nothing)."""
        self._last = None

    def stats(self, wall_s: float, produced: Sequence[int], num_unfinished: int) -> StepStats:
        """What the step just run did; `produced` (tokens returned per request that made
        progress) and `num_unfinished` are used only when the probe is degraded (not `exact`)."""
        if self._scheduler is None:
            return self._derived(wall_s, produced, num_unfinished)
        per_request = scheduled_tokens(self._last)
        return StepStats(
            num_running=len(per_request), num_waiting=waiting_requests(self._scheduler),
            num_scheduled_tokens=sum(per_request), batch_cap=self.batch_cap,
            token_cap=self._token_cap, kv_usage=kv_usage(self._scheduler), wall_s=wall_s,
            tokens_per_request=per_request,
        )

    def _derived(self, wall_s: float, produced: Sequence[int], num_unfinished: int) -> StepStats:
        per_request = tuple(int(n) for n in produced)
        return StepStats(
            num_running=len(per_request), num_waiting=max(0, num_unfinished - len(per_request)),
            num_scheduled_tokens=sum(per_request), batch_cap=self.batch_cap,
            token_cap=self._token_cap, kv_usage=0.0, wall_s=wall_s,
            tokens_per_request=per_request,
        )
