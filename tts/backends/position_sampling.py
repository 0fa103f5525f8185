"""Position-keyed sampling, the arithmetic: one uniform number per (seed, position), and
inverse-CDF sampling of softmax(logits / T) with an optional top-p nucleus. Plain torch, so
it is testable without vLLM; `tts.backends.vllm_sampling` plugs it into vLLM.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, position): SplitMix64 of the
    pair, top 53 bits."""
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def sample_rows(logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor,
                uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling, one row per uniform: the token index whose cumulative
    probability under softmax(logits / T), nucleus-restricted to top_p, first exceeds u.
    The cumulative sum runs in float64, in vocabulary order (sorted order under top-p)."""
    probs = torch.softmax(logits.to(torch.float64) / temperatures[:, None].to(torch.float64), dim=-1)
    nucleus = top_ps < 1.0
    order = None
    if bool(nucleus.any()):
        probs, order = probs.sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        probs = probs.masked_fill((before >= top_ps[:, None].to(torch.float64)) & nucleus[:, None], 0.0)
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(torch.float64)[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=logits.shape[-1] - 1)
    if order is not None:
        idx = order.gather(-1, idx)
    return idx.squeeze(-1)
