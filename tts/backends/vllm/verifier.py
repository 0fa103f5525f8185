"""The verifier backend on vLLM: one engine, one PRM adapter, batched scoring.

`score` asks the adapter for the backend requests of every path, submits them all at
once, and drives the engine step by step until they finish, so the verifier's scheduler
steps are recorded (`ScoreBatchStats.step_stats`) like the generator's. Requests that
share a prefix and are submitted together do share KV blocks: vLLM v1 registers a block's
hash when the block is allocated, so a later request in the same step reuses blocks the
earlier one is computing (observed on 0.32: `num_cached_tokens` > 0 within one batch).

How each read kind is asked of vLLM:
- NEXT_TOKEN: `max_tokens=1`, greedy, and `logprob_token_ids=<labels>` (exact log-probs of
  the label tokens, vLLM >= 0.32) or else the top-`top_logprobs` list.
- PROMPT_TOKENS: `prompt_logprobs=top_logprobs` (top-k per position; no prefix-cache hits).
- POOLING: `PoolingParams(task="token_classify", use_activation=False,
  skip_reading_prefix_cache=False)`, raw per-token outputs of the tokens the engine computed.

A PRM reads the prefix cache like the generator. vLLM 0.32 skips the cache for every
token-pooling request unless asked (`vllm/pooling_params.py`), because a request served
from the cache gets rows only for the tokens it computed. A PRM needs only the rows it
scores, and the adapters end each path at its last scored token (the newest step's), which
vLLM always computes: so the request reads the cache, and row `p - num_cached_tokens` is
position `p`. Its engine pools ALL (one row per computed token) rather than STEP:
vLLM's STEP pooling picks the step tags' rows by their positions in the whole prompt, which
a cached prefix shifts. The rare request one of whose positions came from the cache (an
earlier step of the same text, cached by another path in full blocks) is run again without
the cache.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tts.backends.adapters import PrmAdapter, PromptSpec, ReadKind, ScoreOutput
from tts.backends.adapters import adapter_class, make_adapter
from tts.backends.base import ScoreBatchStats, ScoreRequest, StepStats, Verifier
from tts.backends.vllm.engine import make_llm
from tts.backends.vllm.internals import shutdown_llm, token_prompt
from tts.backends.vllm.stats import SchedulerProbe

if TYPE_CHECKING:  # pragma: no cover
    import vllm

    from tts.config.schema import Config

_ids = itertools.count()


class VllmVerifier(Verifier):
    """`Verifier` over one `vllm.LLM` and one `PrmAdapter`."""

    def __init__(self, llm: vllm.LLM, adapter: PrmAdapter, *, top_logprobs: int = 20) -> None:
        self._llm = llm
        self._engine = llm.llm_engine
        self.adapter = adapter
        self.top_logprobs = top_logprobs
        self._probe = SchedulerProbe(llm)
        self._exact_labels = _supports_label_logprobs()
        self.reruns = 0  # requests run again without the cache: a scored row had been cached

    @classmethod
    def from_model(cls, model_path: str, adapter: str = "judge",
                   adapter_options: dict[str, Any] | None = None, top_logprobs: int = 20,
                   **engine_kwargs: Any) -> VllmVerifier:
        """Start an engine for `model_path` (plus the adapter's own engine arguments) and
        build the adapter `adapter` on its tokenizer; unknown names fail before loading.
        `top_logprobs` above vLLM's default cap (20) needs `engine_kwargs={"max_logprobs": ...}`."""
        extra = verifier_engine_kwargs(adapter)
        extra.update(engine_kwargs.pop("engine_kwargs", None) or {})
        llm = make_llm(model_path, engine_kwargs=extra, **engine_kwargs)
        return cls(llm, make_adapter(adapter, llm.get_tokenizer(), **(adapter_options or {})),
                   top_logprobs=top_logprobs)

    @property
    def llm(self) -> vllm.LLM:
        return self._llm

    @property
    def request_per_score(self) -> bool:
        return self.adapter.request_per_index

    @property
    def reads_partial_steps(self) -> bool:
        return self.adapter.reads_partial_steps

    def _score(
        self, requests: Sequence[ScoreRequest],
    ) -> tuple[list[tuple[float, ...]], ScoreBatchStats]:
        start = time.perf_counter()
        specs: list[PromptSpec] = []
        spans: list[tuple[int, int]] = []
        for req in requests:
            built = self.adapter.build(req.problem, req.steps, req.indices)
            spans.append((len(specs), len(specs) + len(built)))
            specs.extend(built)
        outputs, steps = self.run_specs(specs)
        scores = []
        for req, (lo, hi) in zip(requests, spans):
            values = self.adapter.read(outputs[lo:hi])
            assert len(values) == len(req.indices), (self.adapter.name, len(values), req.indices)
            scores.append(values)
        stats = ScoreBatchStats(
            num_requests=len(specs), prompt_tokens=sum(len(s.token_ids) for s in specs),
            cached_tokens=sum(o.num_cached_tokens for o in outputs),
            wall_s=time.perf_counter() - start, step_stats=tuple(steps))
        return scores, stats

    def run_specs(self, specs: Sequence[PromptSpec]) -> tuple[list[ScoreOutput], list[StepStats]]:
        """Run backend requests together, stepping the engine until all have finished."""
        results: list[ScoreOutput | None] = [None] * len(specs)
        steps: list[StepStats] = []
        self._run(specs, range(len(specs)), results, steps, read_cache=True)
        again = [i for i, r in enumerate(results) if r is None]  # a scored row came from the cache
        if again:
            self.reruns += len(again)
            self._run(specs, again, results, steps, read_cache=False)
        return [r for r in results if r is not None], steps

    def _run(self, specs: Sequence[PromptSpec], which: Sequence[int], results: list[ScoreOutput | None],
             steps: list[StepStats], *, read_cache: bool) -> None:
        ids = {f"score-{next(_ids)}": i for i in which}
        pending = dict(ids)
        try:
            for rid, i in ids.items():
                self._add(rid, specs[i], read_cache)
            while pending:
                if not self._engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM dropped {len(pending)} scoring requests")
                self._probe.begin_step()
                tick = time.perf_counter()
                outputs = self._engine.step()
                wall = time.perf_counter() - tick
                for out in outputs:
                    if out.finished and out.request_id in pending:
                        i = pending.pop(out.request_id)
                        results[i] = self._convert(specs[i], out)
                steps.append(self._probe.stats(wall, [1] * len(outputs), len(pending)))
        finally:
            if pending:
                self._engine.abort_request(list(pending))

    def _add(self, request_id: str, spec: PromptSpec, read_cache: bool = True) -> None:
        prompt = token_prompt(self._llm, list(spec.token_ids))
        self._engine.add_request(request_id, prompt, self._params(spec, read_cache))

    def _params(self, spec: PromptSpec, read_cache: bool = True) -> Any:
        from vllm import PoolingParams, SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if spec.kind is ReadKind.POOLING:
            return PoolingParams(task="token_classify", use_activation=False,
                                 skip_reading_prefix_cache=not read_cache)
        common: dict[str, Any] = dict(max_tokens=1, temperature=0.0, detokenize=False,
                                      output_kind=RequestOutputKind.FINAL_ONLY,
                                      skip_clone=True)  # each request's own: vLLM need not copy them
        if spec.kind is ReadKind.PROMPT_TOKENS:
            return SamplingParams(prompt_logprobs=self.top_logprobs,
                                  logprobs=self.top_logprobs, **common)
        if self._exact_labels and spec.label_ids:
            return SamplingParams(logprob_token_ids=list(spec.label_ids), **common)
        return SamplingParams(logprobs=self.top_logprobs, **common)

    @staticmethod
    def _convert(spec: PromptSpec, out: Any) -> ScoreOutput | None:
        """The output read for `spec`; None when a pooled position it scores was served
        from the prefix cache (no row came back for it)."""
        cached = int(out.num_cached_tokens or 0)
        if spec.kind is ReadKind.POOLING:
            data = out.outputs.data  # one row per computed token: positions cached.. of the prompt
            if data.shape[0] != len(spec.token_ids) - cached:
                raise RuntimeError(f"vLLM returned {data.shape[0]} pooled rows for a prompt of "
                                   f"{len(spec.token_ids)} tokens with {cached} cached: not ALL pooling")
            if min(spec.positions) < cached:
                return None
            rows = tuple(tuple(float(x) for x in data[p - cached].reshape(-1).tolist())
                         for p in spec.positions)
            return ScoreOutput(spec, values=rows, num_cached_tokens=cached)
        after_prompt = _as_floats(out.outputs[0].logprobs[0])
        if spec.kind is ReadKind.NEXT_TOKEN:
            return ScoreOutput(spec, logprobs=(after_prompt,), num_cached_tokens=cached)
        prompt_lps, n = out.prompt_logprobs, len(spec.token_ids)
        # prompt_logprobs[t + 1] is the distribution of token t + 1, i.e. read after position t.
        dists = tuple(_as_floats(prompt_lps[p + 1]) if p + 1 < n else after_prompt
                      for p in spec.positions)
        return ScoreOutput(spec, logprobs=dists, num_cached_tokens=cached)

    def set_limits(self, batch_cap: int | None = None) -> None:
        """Change the engine's batch cap between calls (at most its `max_num_seqs`)."""
        if batch_cap is not None:
            self._probe.set_batch_cap(batch_cap)

    def reset_prefix_cache(self) -> bool:
        """Drop the engine's cached prefixes (between the variants of a comparison)."""
        return bool(self._llm.reset_prefix_cache())

    def close(self) -> None:
        """Stop the engine and let go of it (as `VllmGenerator.close`)."""
        if self._llm is not None:
            shutdown_llm(self._llm)
        self._llm = self._engine = self._probe = None


def verifier_engine_kwargs(adapter: str) -> dict[str, Any]:
    """The `vllm.LLM` arguments adapter `adapter`'s checkpoints need: its own (a pooling
    runner for a reward head) and, for pooling, ALL token pooling (see the module's notes)."""
    extra = dict(adapter_class(adapter).engine_kwargs)
    if extra.get("runner") == "pooling":
        from tts.backends.vllm.internals import all_token_pooling

        extra.setdefault("pooler_config", all_token_pooling())
    return extra


def _as_floats(logprobs: Any) -> dict[int, float]:
    return {int(token): float(lp.logprob) for token, lp in logprobs.items()}


def _supports_label_logprobs() -> bool:
    """Whether SamplingParams takes `logprob_token_ids` (exact label log-probs)."""
    from vllm import SamplingParams

    return "logprob_token_ids" in getattr(SamplingParams, "__struct_fields__", ())
