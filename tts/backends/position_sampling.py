"""Position-keyed sampling, the arithmetic: one uniform number per (seed, position), and
inverse-CDF sampling of softmax(logits / T) with an optional top-p nucleus. Plain torch and
numpy, so it is testable without vLLM; `tts.backends.vllm.sampling` plugs it into vLLM.

Cost (what runs every decode step, per row): one exp over the vocabulary and one blocked
sum, in float32, on the logits' own device; the CDF is searched block by block, so no
full-vocabulary cumulative sum is made (that one pass dominated the float64 version this
replaces: 26% of a 64-sequence decode step on a 2-core Xeon). Top-p rows add a sort. Every
row's draw is computed with the same reductions whatever the batch, so a row's token does
not depend on the other rows (tested); float32 rounding moves a draw only when the uniform
lands within ~1e-6 of a token's CDF boundary, far below what the bf16 logits themselves move.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_BLOCK = 256  # tokens per CDF block: the vocabulary is searched block, then token
_M1, _M2, _M3 = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0x632BE59BD9B4E019
_S1, _S2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def position_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, position): SplitMix64 of the
    pair, top 53 bits. (`position_uniforms` is the same function over arrays.)"""
    x = (seed * _M1 + position * _M2 + _M3) & _MASK64
    x = ((x ^ (x >> 30)) * _S1) & _MASK64
    x = ((x ^ (x >> 27)) * _S2) & _MASK64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def position_uniforms(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`position_uniform` for arrays of seeds (uint64) and positions, vectorised:
    identical values, no Python work per element (uint64 arithmetic wraps like the mask)."""
    u64 = np.uint64
    x = seeds.astype(u64) * u64(_M1) + positions.astype(u64) * u64(_M2) + u64(_M3)
    x = (x ^ (x >> u64(30))) * u64(_S1)
    x = (x ^ (x >> u64(27))) * u64(_S2)
    x ^= x >> u64(31)
    return (x >> u64(11)).astype(np.float64) / float(1 << 53)


def sample_rows(logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor,
                uniforms: torch.Tensor, nucleus_rows: torch.Tensor | None = None,
                inplace: bool = False) -> torch.Tensor:
    """Inverse-CDF sampling, one row per uniform: the index of the token whose cumulative
    probability under softmax(logits / T) first exceeds u, in vocabulary order; for a row
    with top_p < 1, restricted to its top-p nucleus and in descending-probability order.
    Only tokens of positive probability are ever returned, and a row's token depends on its
    own logits, temperature, top-p and uniform only, never on the other rows.

    `nucleus_rows` are the rows with top_p < 1 (None: found from `top_ps`, a host sync on a
    GPU). `inplace` lets float32 `logits` be overwritten with the rows' unnormalised
    probabilities (the caller's scratch), saving a copy of the batch.
    """
    x = logits if logits.dtype == torch.float32 else logits.float()
    temps = temperatures.to(x.device, torch.float32)[:, None]
    top = x.amax(dim=-1, keepdim=True)
    # exp((x - max) / T): softmax's numerator, every value in [0, 1]; in place on a copy
    probs = x.sub_(top) if inplace or x is not logits else x.sub(top)
    probs = probs.div_(temps).exp_()
    u = uniforms.to(probs.device, torch.float32)
    tokens = _search(probs, u)
    if nucleus_rows is None:
        nucleus_rows = (top_ps < 1.0).nonzero().squeeze(-1).to(probs.device)
    if nucleus_rows.numel():
        tokens[nucleus_rows] = _nucleus(probs[nucleus_rows], top_ps.to(probs.device)[nucleus_rows],
                                        u[nucleus_rows])
    return tokens


def _nucleus(probs: torch.Tensor, top_ps: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Top-p rows: the smallest set of most probable tokens whose mass reaches top_p,
    searched in descending-probability order."""
    probs, order = probs.sort(dim=-1, descending=True)
    cumulative = probs.cumsum(dim=-1)
    above = cumulative - probs  # mass strictly above each token
    probs = probs.masked_fill(above >= top_ps.to(torch.float32)[:, None] * cumulative[:, -1:], 0.0)
    return order.gather(-1, _search(probs, uniforms)[:, None]).squeeze(-1)


def _search(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative mass exceeds u x total, found block then token;
    clamped so that float rounding can only land on a token of positive mass."""
    rows, vocab = probs.shape
    nb = -(-vocab // _BLOCK)
    if nb * _BLOCK != vocab:
        probs = torch.nn.functional.pad(probs, (0, nb * _BLOCK - vocab))
    blocks = probs.view(rows, nb, _BLOCK)
    block_cdf = blocks.sum(dim=-1).cumsum_(dim=-1)  # [rows, nb]
    total = block_cdf[:, -1:]
    # u < 1, but u x total may round up to total: keep the target below it
    target = torch.minimum(uniforms[:, None] * total, total * (1.0 - 2.0 ** -23))  # [rows, 1]
    j = torch.searchsorted(block_cdf, target, right=True).clamp_(max=nb - 1)  # block index
    below = torch.where(j > 0, block_cdf.gather(1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, j[:, :, None].expand(rows, 1, _BLOCK)).squeeze(1).cumsum_(dim=-1)
    top = inner[:, -1:]
    # the block's own cumulative sum decides; keep the target inside (0 .. its total)
    local = torch.minimum((target - below).clamp_(min=0.0), top * (1.0 - 2.0 ** -23))
    i = torch.searchsorted(inner, local, right=True).clamp_(max=_BLOCK - 1)
    return (j * _BLOCK + i).squeeze(-1)
