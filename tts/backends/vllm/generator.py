"""The generator backend on vLLM: step-level control of one in-process engine.

Requests go in through `LLMEngine.add_request` with token-id prompts and streamed
(`RequestOutputKind.DELTA`) sampling parameters, without stop strings: the search engine
finds step boundaries in the deltas itself. `step()` is one `LLMEngine.step()`: one
scheduler iteration, so each running request advances by one decode token or one prefill
chunk. Aborts go straight to the in-process engine core, so they take effect before the
next step, and any output of an aborted request is dropped here as well.

With overlap (`make_llm(async_scheduling=True)`, `generator.overlap`), `step()` schedules a
batch, launches it and returns the outputs of the batch before (the first returns none):
the engine sees each token one step late. A request it stops then, or one that ended at
EOS, is already in the batch in flight; that token is computed and thrown away. Those late
tokens are counted from the scheduler's last batch (`SchedulerProbe.in_flight`): an abort
returns its own, a step reports those of the EOS it returns (`StepStats.late_tokens`). A
request that reaches `max_tokens` costs none: vLLM's scheduler does not schedule it again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tts.backends.base import FinishReason, GenDelta, Generator, GenRequest, StepStats
from tts.backends.codec import ChatCodec
from tts.backends.vllm.engine import make_llm
from tts.backends.vllm.internals import (
    SEEDED_CPU_ERROR, UnsupportedVllmError, async_scheduling, seeded_sampling_safe, shutdown_llm, token_prompt,
)
from tts.backends.vllm.stats import SchedulerProbe

if TYPE_CHECKING:  # pragma: no cover
    import vllm

    from tts.config.schema import Config

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": FinishReason.EOS,  # no stop strings are set: only EOS / generation-config EOS ids
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORTED,
}


def sampler_engine_kwargs(position_sampling: bool) -> dict[str, Any]:
    """The `vllm.LLM` arguments that install the position-keyed sampler (none without it)."""
    if not position_sampling:
        return {}
    from tts.backends.vllm.sampling import PositionSampler
    return {"logits_processors": [PositionSampler]}


@dataclass
class _Live:
    num_prompt_tokens: int
    reported: bool = False  # whether the first delta (with the cache counters) went out


class VllmGenerator(Generator):
    """`Generator` over one `vllm.LLM` (built with `make_llm`, in-process engine).

    Sampling is seeded per request (`GenRequest.seed`), so a request repeated with the same
    prompt, seed and parameters yields the same tokens. Temperature 0 is greedy.
    `resumable_sampling` must say whether `llm` was built with the position-keyed sampler
    (`tts.backends.vllm.sampling.PositionSampler`); without it, vLLM's per-request random
    stream makes resumed and run-on requests sample other tokens.
    """

    def __init__(self, llm: vllm.LLM, resumable_sampling: bool = False) -> None:
        self._llm = llm
        self.resumable_sampling = resumable_sampling
        self._engine = llm.llm_engine
        self._codec = ChatCodec(llm.get_tokenizer())
        self._probe = SchedulerProbe(llm)
        self.overlap = async_scheduling(llm)  # each step returns the batch before (module doc)
        # False on a CPU engine vLLM's seeded sampler would crash on (internals.py)
        self._seeded_ok = seeded_sampling_safe(llm)
        self._live: dict[str, _Live] = {}
        self._eos = self._codec.eos_token_id
        # vLLM also stops at the generation config's end-of-sequence ids (its stop_token_ids)
        extra = self._engine.model_config.try_get_generation_config().get("eos_token_id")
        extra = [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
        self._eos_ids = frozenset([self._eos, *map(int, extra)])

    @classmethod
    def from_model(cls, model_path: str, position_sampling: bool = True,
                   **engine_kwargs: Any) -> VllmGenerator:
        """Start an engine with `make_llm(model_path, **engine_kwargs)` and wrap it, with
        the position-keyed sampler unless `position_sampling` is False."""
        extra = dict(engine_kwargs.pop("engine_kwargs", None) or {})
        engine_kwargs["engine_kwargs"] = extra | sampler_engine_kwargs(position_sampling)
        return cls(make_llm(model_path, **engine_kwargs), resumable_sampling=position_sampling)

    @property
    def llm(self) -> vllm.LLM:
        return self._llm

    @property
    def eos_token_id(self) -> int:
        return self._eos

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def batch_cap(self) -> int:
        return self._probe.batch_cap

    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        return self._codec.encode_prompt(problem, system_prompt)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        return self._codec.token_text(token_id)

    def _add(self, request: GenRequest) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, SamplingType

        if request.request_id in self._live:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens: {request.max_tokens} must be >= 1")
        # skip_clone: these parameters are this request's alone, so vLLM need not deep-copy
        # them on the way in (a third of its add_request at n=512)
        kwargs = dict(max_tokens=request.max_tokens, temperature=request.temperature,
                      top_p=request.top_p, seed=request.seed, output_kind=RequestOutputKind.DELTA,
                      detokenize=False, skip_special_tokens=True, ignore_eos=request.ignore_eos, skip_clone=True)
        if self.resumable_sampling:
            from tts.backends.vllm.sampling import position_params
            params = position_params(**kwargs)
        else:
            params = SamplingParams(**kwargs)
            if params.sampling_type is SamplingType.RANDOM_SEED and not self._seeded_ok:
                raise UnsupportedVllmError(SEEDED_CPU_ERROR)
        prompt = token_prompt(self._llm, list(request.prompt_token_ids))
        self._engine.add_request(request.request_id, prompt, params)
        self._live[request.request_id] = _Live(num_prompt_tokens=len(request.prompt_token_ids))

    def _step(self) -> tuple[list[GenDelta], StepStats]:
        self._probe.begin_step()
        start = time.perf_counter()
        outputs = self._engine.step() if self._engine.has_unfinished_requests() else []
        wall = time.perf_counter() - start
        deltas = self._deltas(outputs)
        produced = () if self._probe.exact else [len(d.new_token_ids) for d in deltas]  # read only then
        stats = self._probe.stats(wall, produced, len(self._live))
        if self.overlap:  # an EOS came back after vLLM scheduled its request once more
            flight = self._probe.in_flight()
            late = sum(d.finish_reason is FinishReason.EOS and d.request_id in flight for d in deltas)
            stats = replace(stats, late_tokens=late) if late else stats
        return deltas, stats

    def _deltas(self, outputs: list[Any]) -> list[GenDelta]:
        """One `GenDelta` per output of a request still live (an aborted one's last output is
        dropped). The loop runs once per running request and step (512 at n=512): a request
        past its first delta that did not finish takes the short way."""
        live = self._live
        deltas: list[GenDelta] = []
        append = deltas.append
        for output in outputs:
            rid = output.request_id
            entry = live.get(rid)
            if entry is None:
                continue
            if entry.reported and not output.finished:
                append(GenDelta(rid, tuple(output.outputs[0].token_ids)))
            else:
                append(self._delta(output, entry))
        return deltas

    def _delta(self, output: Any, live: _Live) -> GenDelta:
        completion = output.outputs[0]
        reason = None
        if output.finished:
            reason = _FINISH_REASONS.get(str(completion.finish_reason), FinishReason.ABORTED)
            del self._live[output.request_id]
        first = not live.reported
        live.reported = True
        return GenDelta(
            request_id=output.request_id, new_token_ids=tuple(completion.token_ids),
            finish_reason=reason,
            num_cached_tokens=int(output.num_cached_tokens or 0) if first else None,
            num_prompt_tokens=live.num_prompt_tokens if first else None,
        )

    def _abort(self, request_ids: list[str]) -> int:
        ids = [rid for rid in request_ids if self._live.pop(rid, None) is not None]
        if ids:
            self._engine.abort_request(ids)
        return len(self._probe.in_flight().intersection(ids)) if self.overlap and ids else 0

    def num_unfinished(self) -> int:
        return len(self._live)

    def set_limits(self, batch_cap: int | None = None) -> None:
        """Change how many requests run together, between steps (see
        `SchedulerProbe.set_batch_cap`: at most the engine's `max_num_seqs`)."""
        if batch_cap is not None:
            self._probe.set_batch_cap(batch_cap)

    def reset_prefix_cache(self) -> bool:
        """Drop the engine's cached prefixes (between the variants of a comparison)."""
        return bool(self._llm.reset_prefix_cache())

    def close(self) -> None:
        """Stop the engine and let go of it: whatever still holds this backend (a frame a
        library kept alive) then holds no model or KV cache. Using it afterwards fails."""
        if self._llm is None:
            return
        self.abort(list(self._live))
        shutdown_llm(self._llm)
        self._llm = self._engine = self._probe = None

