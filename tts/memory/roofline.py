"""Roofline cost model of one transformer forward pass (prefill or one decode step).

``T_roof = max(FLOPs / (P * 1e12), bytes / (BW * 1e9))`` as in FlashTTS section 4.3.

Approximations, kept deliberately simple (this model ranks batch sizes, it does not
predict wall time):

- FLOPs count the matmuls only: ``2 * params`` per token for the projections and MLP,
  plus attention scores and values (``QK^T`` and ``AV``); norms, rotary, softmax and
  sampling are ignored. The MLP is a gated (SwiGLU) MLP with three matrices.
- Prefill computes logits for the last position of each sequence only (vLLM's default
  when prompt logprobs are not asked for, as in PRM scoring); decode computes them for
  every sequence.
- Bytes: every weight is read once per forward pass (for untied input embeddings this
  overcounts, since only the looked-up rows are read); the KV cache is written for new
  tokens and, in decode, read for the whole context; activations are read and written
  once at every matmul (no fusion). In prefill, attention is assumed fused
  (FlashAttention-style), so the K/V of the prompt is not re-read from memory.

Every per-sequence quantity is linear in the batch size, so a :class:`StageCost` holds
the per-sequence terms and evaluates the roofline time for a scalar batch or a numpy
array of batch sizes with identical floating-point operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tts.memory.device import DeviceProfile

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
IntOrArray = int | np.ndarray
"""A batch size, or a numpy array of batch sizes to evaluate at once."""
FloatOrArray = float | np.ndarray


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a dense decoder-only transformer that the cost model needs."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int
    """Bytes per weight and per KV element (2 for bf16/fp16)."""
    num_params: int
    """Total parameter count, embeddings included (weights bytes = num_params * dtype_bytes)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "dtype_bytes", "num_params"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelShape.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: K and V, every layer, every KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of the q/k/v/o projections and the gated MLP in one layer."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return 2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights."""
        return self.num_params * self.dtype_bytes

    @property
    def activation_elems_per_token(self) -> int:
        """Activation elements read or written by the matmuls of all layers, per token."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # attention: read x, write q,k,v; read attn out, write o. MLP: read x, write gate+up,
        # read act, write down.
        per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * self.intermediate_size) + (self.intermediate_size + h)
        return self.num_layers * per_layer

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], dtype_bytes: int | None = None,
                       num_params: int | None = None) -> ModelShape:
        """Read a Hugging Face ``config.json`` dict (llama, qwen2, mistral style).

        ``head_dim`` defaults to ``hidden_size // num_attention_heads`` and
        ``num_key_value_heads`` to ``num_attention_heads``; the dtype comes from
        ``torch_dtype`` (or ``dtype``), bf16 when absent. ``num_params`` is estimated from
        the shape unless given. Mixture-of-experts configs are rejected.
        """
        cfg = config.get("text_config", config)
        for key in _MOE_KEYS:
            if (cfg.get(key) or 0) > 1:
                raise ValueError(f"mixture-of-experts config ({key}={cfg[key]}) is not supported")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        shape = dict(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            dtype_bytes=dtype_bytes if dtype_bytes is not None else _dtype_bytes(cfg),
        )
        if num_params is None:
            num_params = _estimate_params(cfg, shape)
        return cls(**shape, num_params=num_params)


def _dtype_bytes(cfg: dict[str, Any]) -> int:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown torch_dtype {name!r}; valid: {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _estimate_params(cfg: dict[str, Any], shape: dict[str, int]) -> int:
    """Parameter count of a llama-style model: embeddings, layers, norms, qkv biases."""
    h, layers = shape["hidden_size"], shape["num_layers"]
    q = shape["num_heads"] * shape["head_dim"]
    kv = shape["num_kv_heads"] * shape["head_dim"]
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * shape["intermediate_size"] + 2 * h
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
        per_layer += q + 2 * kv  # qwen2 always has q/k/v biases
    embed = shape["vocab_size"] * h
    lm_head = 0 if cfg.get("tie_word_embeddings", False) else embed
    return embed + lm_head + layers * per_layer + h


@dataclass(frozen=True)
class StageCost:
    """FLOPs and bytes of one forward pass as ``fixed + batch * per_seq``."""

    flops_per_seq: float
    bytes_fixed: float
    """Bytes independent of the batch: the weights."""
    bytes_per_seq: float

    def flops(self, batch: IntOrArray) -> FloatOrArray:
        """FLOPs for ``batch`` sequences (int or numpy array)."""
        return batch * self.flops_per_seq

    def bytes(self, batch: IntOrArray) -> FloatOrArray:
        """Bytes moved for ``batch`` sequences (int or numpy array)."""
        return self.bytes_fixed + batch * self.bytes_per_seq

    def time(self, batch: IntOrArray, device: DeviceProfile) -> FloatOrArray:
        """Roofline seconds for ``batch`` sequences; vectorises over a numpy array."""
        compute = self.flops(batch) / (device.peak_tflops * 1e12)
        memory = self.bytes(batch) / (device.bandwidth_gbs * 1e9)
        return np.maximum(compute, memory) if isinstance(batch, np.ndarray) else max(compute, memory)


def prefill_cost(shape: ModelShape, seq: int) -> StageCost:
    """Cost of prefilling ``seq`` tokens per sequence (causal attention, last-token logits)."""
    linear = 2 * shape.num_layers * shape.matmul_params_per_layer * seq
    # QK^T and AV: 2 matmuls * 2 FLOPs * heads * head_dim per (query, key) pair; causal
    # masking halves the seq^2 pairs.
    attention = 2 * shape.num_layers * shape.num_heads * shape.head_dim * seq * seq
    logits = 2 * shape.hidden_size * shape.vocab_size
    per_seq_bytes = seq * (shape.kv_bytes_per_token + shape.activation_elems_per_token * shape.dtype_bytes)
    return StageCost(float(linear + attention + logits), float(shape.weight_bytes), float(per_seq_bytes))


def decode_cost(shape: ModelShape, ctx: float) -> StageCost:
    """Cost of one decode step per sequence attending to ``ctx`` cached tokens."""
    linear = 2 * shape.num_layers * shape.matmul_params_per_layer
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * ctx
    logits = 2 * shape.hidden_size * shape.vocab_size
    kv = shape.kv_bytes_per_token * (ctx + 1)  # read the context, write the new token
    act = (shape.activation_elems_per_token + shape.vocab_size) * shape.dtype_bytes
    return StageCost(float(linear + attention + logits), float(shape.weight_bytes), float(kv + act))


def prefill_flops(shape: ModelShape, batch: int, seq: int) -> float:
    """FLOPs to prefill ``batch`` sequences of ``seq`` tokens."""
    return prefill_cost(shape, seq).flops(batch)


def decode_flops(shape: ModelShape, batch: int, ctx: float) -> float:
    """FLOPs of one decode step for ``batch`` sequences with ``ctx`` cached tokens each."""
    return decode_cost(shape, ctx).flops(batch)


def prefill_bytes(shape: ModelShape, batch: int, seq: int) -> float:
    """Bytes moved to prefill ``batch`` sequences of ``seq`` tokens."""
    return prefill_cost(shape, seq).bytes(batch)


def decode_bytes(shape: ModelShape, batch: int, ctx: float) -> float:
    """Bytes moved by one decode step for ``batch`` sequences with ``ctx`` cached tokens."""
    return decode_cost(shape, ctx).bytes(batch)


def t_roof(flops: float, nbytes: float, device: DeviceProfile) -> float:
    """Roofline time: ``max(flops / peak, bytes / bandwidth)`` in seconds."""
    return max(flops / (device.peak_tflops * 1e12), nbytes / (device.bandwidth_gbs * 1e9))


def t_prefill(shape: ModelShape, device: DeviceProfile, batch: int, seq: int) -> float:
    """Roofline seconds to prefill ``batch`` sequences of ``seq`` tokens."""
    return prefill_cost(shape, seq).time(batch, device)


def t_decode_step(shape: ModelShape, device: DeviceProfile, batch: int, ctx: float) -> float:
    """Roofline seconds for one decode step of ``batch`` sequences at context ``ctx``."""
    return decode_cost(shape, ctx).time(batch, device)
