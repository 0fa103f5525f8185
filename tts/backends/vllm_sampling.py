"""Position-keyed sampling for vLLM: a seeded request samples the same token at the same
position, however it got there.

vLLM seeds a request's sampling with its own random generator, started at the request's
first sampled token. A request that runs on past a step boundary, or a fresh request that
resumes from part of a step, therefore samples other tokens than the request the baseline
sends for that step, and every speculative step that is reused changes the search tree.

`PositionSampler` replaces the randomness, not the distribution: each seeded, non-greedy
row draws one uniform number from a hash of (seed, absolute position), where the position
is the prompt length plus the tokens generated so far, and takes the token at that point of
the cumulative distribution of softmax(logits / temperature) (restricted to the top-p
nucleus when top_p < 1). That is an exact sample of the distribution vLLM samples from; it
then leaves that token as the only finite logit, so vLLM's own sampler (temperature, top-p,
its own random draw) can only pick it. The token is a function of (seed, position, logits):
a request resumed from any prefix of its own output, or run on past a step boundary, with
the same seed, samples what the uninterrupted request would, up to the batch-dependent
rounding of the logits themselves.

The position is read from vLLM's live list of the request's output tokens, which is
current before each forward pass with synchronous scheduling (`make_llm` sets
`async_scheduling=False`; with asynchronous scheduling it could lag one token).
Greedy rows (temperature 0) and rows without a seed are left to vLLM. Logprobs that vLLM
returns come from the raw logits (its default `raw_logprobs` mode), so they are unchanged.
Enabled by `generator.sampler=position` (the default); `vllm` keeps vLLM's own sampler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from tts.backends.position_sampling import position_uniform, sample_rows

_EPS = 1e-5  # vLLM's own threshold for greedy sampling


def _position_sampled(params: SamplingParams) -> bool:
    """Seeded and not greedy: the rows this sampler decides."""
    return params.seed is not None and params.temperature >= _EPS


@dataclass
class _Row:
    seed: int
    temperature: float
    top_p: float
    prompt_len: int
    output_ids: list[int]  # vLLM's live list of the request's generated tokens

    @property
    def position(self) -> int:
        return self.prompt_len + len(self.output_ids)


class PositionSampler(LogitsProcessor):
    """vLLM logits processor: position-keyed sampling for seeded requests (module doc)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Seeded sampling here is temperature and top-p only: a request that asks for more
        would silently lose it (the row leaves vLLM one finite logit), so it is refused."""
        if not _position_sampled(sampling_params):
            return
        p = sampling_params
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

    @classmethod
    def new_row(cls, params: SamplingParams, prompt_ids: list[int] | None,
                output_ids: list[int]) -> _Row | None:
        if not _position_sampled(params):
            return None
        if prompt_ids is None:
            raise ValueError("position sampling needs token-id prompts (prompt_token_ids)")
        return _Row(int(params.seed), float(params.temperature), float(params.top_p),
                    len(prompt_ids), output_ids)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the token: it must run before temperature and top-p

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self.new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        index = [i for i in self.rows if i < logits.shape[0]]
        if not index:
            return logits
        rows = [self.rows[i] for i in index]
        idx = torch.tensor(index, dtype=torch.long, device=logits.device)
        tokens = sample_rows(
            logits.index_select(0, idx),
            torch.tensor([r.temperature for r in rows], device=logits.device),
            torch.tensor([r.top_p for r in rows], device=logits.device),
            torch.tensor([position_uniform(r.seed, r.position) for r in rows],
                         dtype=torch.float64, device=logits.device),
        )
        logits.index_fill_(0, idx, float("-inf"))
        logits[idx, tokens] = 0.0
        return logits
