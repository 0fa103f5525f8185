"""Position-keyed sampling for vLLM: a seeded request samples the same token at the same
position, however it got there.

vLLM seeds a request's sampling with its own random generator, started at the request's
first sampled token. A request that runs on past a step boundary, or a fresh request that
resumes from part of a step, therefore samples other tokens than the request the baseline
sends for that step, and every speculative step that is reused changes the search tree.

`PositionSampler` replaces the randomness, not the distribution: each row it owns draws one
uniform number from a hash of (seed, absolute position), where the position is the prompt
length plus the tokens generated so far, and takes the token at that point of the
cumulative distribution of softmax(logits / temperature) (restricted to the top-p nucleus
when top_p < 1): an exact sample of the distribution vLLM samples from.

When it holds, and when it does not: the token is a function of (seed, position, logits).
A request resumed from any prefix of its own output, or run on past a step boundary,
samples what the uninterrupted request would *if its logits are the same*. They are in
float32 on CPU (tested), and with batch-invariant kernels (vLLM's `VLLM_BATCH_INVARIANT=1`
on a GPU). In bf16 (every GPU's default, and CPUs with AVX512-BF16 or AMX) the logits
depend on the batch's shape and on what the prefix cache served, so a resumed request
drifts from the uninterrupted one after some tokens: exactness is gone, and with it the
reason to pay for this sampler. Hence `generator.sampler=auto` (the default) picks this
sampler only where the generator runs float32 or batch-invariant kernels, and vLLM's own
elsewhere (`resolve_sampler`).

How it plugs in, at no cost to vLLM's own path:
- A request opts in through `SamplingParams.extra_args[EXTRA_KEY] = [seed, temperature,
  top_p]` (`position_params` builds it) and is sent to vLLM as *greedy* (temperature 0):
  this processor leaves its token as the row's maximum, so vLLM's sampler only takes an
  argmax for it instead of its own seeded random draw, which for seeded rows loops over a
  per-request generator in Python. Requests without the key are vLLM's as usual.
- The rows' parameters live in arrays rebuilt only when the batch changes; each step reads
  the rows' output lengths (a C-level `map(len)` over vLLM's live output lists), hashes the
  positions with numpy (`position_uniforms`) and samples all rows in one vectorised float32
  pass (`sample_rows`). On a GPU the only host-to-device traffic per step is the rows'
  uniforms, one small non-blocking copy from pinned memory; nothing syncs.

The position is read from the length of vLLM's live list of the request's output tokens,
which is current before each forward pass with synchronous scheduling, and with
asynchronous scheduling too (`generator.overlap`, `make_llm(async_scheduling=True)`):
there the host learns a token a step late, but vLLM 0.32's V1 runner appends a -1
placeholder to the list as it samples (`gpu_model_runner.py`, `_bookkeeping_sync`) and
writes the real token over it before the next step's logits processors run
(`update_async_output_token_ids`, which it does because a custom processor reads the
lists). The length, all this sampler reads, is never behind; the test drives the sampler
through those list states (`test_position_sampling.py`). Read in vLLM's source, not yet
run on a GPU here. Logprobs that vLLM returns come from the raw logits (its default
`raw_logprobs` mode), so they are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from tts.backends.position_sampling import position_uniforms, sample_rows
from tts.backends.vllm.internals import logits_processor_api

LogitsProcessor, BatchUpdate, process_dict_updates = logits_processor_api()

EXTRA_KEY = "tts_position_sampling"
_EPS = 1e-5  # vLLM's own threshold for greedy sampling
_MASK64 = (1 << 64) - 1
_WINNER = 1e30  # the sampled token's logit: above every other row value, finite (no NaN downstream)


def position_params(*, max_tokens: int, seed: int, temperature: float, top_p: float = 1.0,
                    **kwargs: Any) -> SamplingParams:
    """SamplingParams for a position-sampled request (greedy for vLLM, the real sampling
    parameters in `extra_args`); a greedy request keeps vLLM's sampling. Sampling options
    this sampler cannot honour (top-k, min-p, penalties) are refused here, before vLLM's
    greedy normalisation would silently drop them. The real parameters are checked once per
    set of options (`_checked`: a request differs only in its seed and length, and building
    vLLM's SamplingParams to check them cost a tenth of each request's add at n=512)."""
    if temperature < _EPS:
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, **kwargs)
    _checked(float(temperature), float(top_p), tuple(sorted((k, repr(v)) for k, v in kwargs.items())), kwargs)
    extra = dict(kwargs.pop("extra_args", None) or {})
    extra[EXTRA_KEY] = [int(seed), float(temperature), float(top_p)]
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra, **kwargs)


_CHECKED: set[tuple] = set()


def _checked(temperature: float, top_p: float, key: tuple, kwargs: dict[str, Any]) -> None:
    """vLLM's own checks of these sampling options, and the refusal of those the position
    sampler cannot honour, once per set of options (raises as SamplingParams does)."""
    if (temperature, top_p, key) in _CHECKED:
        return
    _refuse_unsupported(SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p, seed=0, **kwargs))
    _CHECKED.add((temperature, top_p, key))


def _refuse_unsupported(p: SamplingParams) -> None:
    unsupported = {"top_k": p.top_k not in (-1, 0), "min_p": p.min_p > 0,
                   "repetition_penalty": p.repetition_penalty != 1.0,
                   "presence_penalty": p.presence_penalty != 0.0,
                   "frequency_penalty": p.frequency_penalty != 0.0}
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise VLLMValidationError(
            f"position sampling (generator.sampler=position) supports temperature and top_p "
            f"only; this request sets {', '.join(bad)} (use generator.sampler=vllm)",
            parameter=bad[0])


@dataclass
class _Row:
    seed: int
    temperature: float
    top_p: float
    prompt_len: int
    output_ids: list[int]  # vLLM's live list of the request's generated tokens


class PositionSampler(LogitsProcessor):
    """vLLM logits processor: position-keyed sampling for the requests that ask for it
    (module doc)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.rows: dict[int, _Row] = {}
        self._pin = bool(is_pin_memory) and device.type != "cpu"
        self._winner = torch.tensor(_WINNER, dtype=torch.float32, device=device)
        self._rebuild()

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Position sampling is temperature and top-p only: a request that asks for more
        would silently lose it, so it is refused."""
        spec = (sampling_params.extra_args or {}).get(EXTRA_KEY)
        if spec is None:
            return
        p = sampling_params
        if not (isinstance(spec, (list, tuple)) and len(spec) == 3):
            raise VLLMValidationError(f"extra_args[{EXTRA_KEY!r}] must be [seed, temperature, top_p], "
                                      f"got {spec!r}", parameter="extra_args")
        _, temperature, top_p = spec
        if not (temperature >= _EPS and 0.0 < top_p <= 1.0):
            raise VLLMValidationError(f"position sampling needs temperature > 0 and top_p in (0, 1], "
                                      f"got {temperature}, {top_p}", parameter="extra_args")
        if p.temperature >= _EPS:
            raise VLLMValidationError("position sampling: send the request greedy (temperature 0) "
                                      "with its temperature in extra_args (see position_params)",
                                      parameter="temperature")
        _refuse_unsupported(p)

    @classmethod
    def new_row(cls, params: SamplingParams, prompt_ids: list[int] | None,
                output_ids: list[int]) -> _Row | None:
        spec = (params.extra_args or {}).get(EXTRA_KEY)
        if spec is None:
            return None
        if prompt_ids is None:
            raise ValueError("position sampling needs token-id prompts (prompt_token_ids)")
        seed, temperature, top_p = spec
        return _Row(int(seed) & _MASK64, float(temperature), float(top_p), len(prompt_ids), output_ids)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token: it must run before vLLM's sampling

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if process_dict_updates(self.rows, batch_update, self.new_row):
            self._rebuild()

    def _rebuild(self) -> None:
        """The rows as arrays (host) and tensors (device), made when the batch changes."""
        index = sorted(self.rows)
        rows = [self.rows[i] for i in index]
        self._outputs = [r.output_ids for r in rows]
        self._seeds = np.array([r.seed for r in rows], dtype=np.uint64)
        self._prompt_lens = np.array([r.prompt_len for r in rows], dtype=np.int64)
        self._index_host = index
        self._index_max = index[-1] if index else -1
        # rows 0..k-1 in order: when they are the whole batch, the logits are sampled in place
        self._leading = index == list(range(len(index)))
        dev = self.device
        self._index = torch.tensor(index, dtype=torch.long, device=dev)
        self._temps = torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=dev)
        self._top_ps = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
        self._nucleus = torch.tensor([k for k, r in enumerate(rows) if r.top_p < 1.0], dtype=torch.long,
                                     device=dev)
        self._uniforms = torch.empty(len(rows), dtype=torch.float32, pin_memory=self._pin)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._outputs:
            return logits
        if self._index_max >= logits.shape[0]:  # rare: not every owned row has logits this step
            keep = [k for k, i in enumerate(self._index_host) if i < logits.shape[0]]
            return self._sample(logits, keep) if keep else logits
        return self._sample(logits, None)

    def _sample(self, logits: torch.Tensor, keep: list[int] | None) -> torch.Tensor:
        """Sample the owned rows (`keep`: positions among them; None: all) and leave each
        one's token as its row's maximum."""
        outputs, seeds, prompt_lens = self._outputs, self._seeds, self._prompt_lens
        index, temps, top_ps, uniforms = self._index, self._temps, self._top_ps, self._uniforms
        nucleus = self._nucleus
        if keep is not None:
            outputs, seeds, prompt_lens = [outputs[k] for k in keep], seeds[keep], prompt_lens[keep]
            sel = torch.tensor(keep, dtype=torch.long, device=self.device)
            index, temps, top_ps = index[sel], temps[sel], top_ps[sel]
            nucleus = torch.tensor([n for n, k in enumerate(keep) if self.rows[self._index_host[k]].top_p < 1.0],
                                   dtype=torch.long, device=self.device)
            uniforms = uniforms[: len(keep)]
        lengths = np.fromiter(map(len, outputs), dtype=np.int64, count=len(outputs))
        uniforms.numpy()[:] = position_uniforms(seeds, prompt_lens + lengths)
        if self._pin:
            uniforms = uniforms.to(self.device, non_blocking=True)
        whole = keep is None and self._leading and len(outputs) == logits.shape[0]
        rows = logits if whole else logits.index_select(0, index)
        tokens = sample_rows(rows, temps, top_ps, uniforms, nucleus_rows=nucleus, inplace=True)
        logits.index_put_((index, tokens), self._winner)
        return logits
