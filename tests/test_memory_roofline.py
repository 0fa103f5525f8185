"""Roofline cost model: literal shapes and literal FLOP/byte counts."""

import numpy as np
import pytest

from tts.memory.device import DeviceProfile
from tts.memory.roofline import (
    ModelShape,
    decode_bytes,
    decode_cost,
    decode_flops,
    prefill_bytes,
    prefill_cost,
    prefill_flops,
    t_decode_step,
    t_prefill,
    t_roof,
)

# SmolLM2-135M-Instruct config.json (the fields the model reads).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

# layers=1, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10, bf16.
TINY = ModelShape(1, 4, 2, 1, 2, 8, 10, 2, 1000)

# Round numbers: ridge point = 100e12 / 1000e9 = 100 FLOP/byte.
ROUND = DeviceProfile("round", "gpu", peak_tflops=100.0, bandwidth_gbs=1000.0, memory_gb=10.0, source="test")


def test_smollm2_kv_bytes_per_token_exact():
    shape = ModelShape.from_hf_config(SMOLLM2_135M)
    assert shape.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23040


def test_smollm2_shape_fields_and_param_count():
    shape = ModelShape.from_hf_config(SMOLLM2_135M)
    assert shape == ModelShape(30, 576, 9, 3, 64, 1536, 49152, 2, 134_515_008)
    assert shape.weight_bytes == 269_030_016  # ENV.md: 134.5M parameters, 269 MB in bf16


def test_from_hf_config_defaults_and_overrides():
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "float32"}
    shape = ModelShape.from_hf_config(cfg)
    assert (shape.num_kv_heads, shape.head_dim, shape.dtype_bytes) == (4, 16, 4)
    shape = ModelShape.from_hf_config({**cfg, "head_dim": 32}, dtype_bytes=2, num_params=7)
    assert (shape.head_dim, shape.dtype_bytes, shape.num_params) == (32, 2, 7)


def test_qwen2_params_include_qkv_bias():
    cfg = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 1536,
           "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
           "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    assert ModelShape.from_hf_config(cfg).num_params == 1_543_714_304  # Qwen2.5-1.5B


def test_from_hf_config_rejects_moe_and_unknown_dtype():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelShape.from_hf_config({**SMOLLM2_135M, "num_local_experts": 8})
    with pytest.raises(ValueError, match="bfloat16"):
        ModelShape.from_hf_config({**SMOLLM2_135M, "torch_dtype": "int3"})


def test_tiny_prefill_and_decode_flops_literal():
    # per-layer matmul params: 2*4*4 (q,o) + 2*4*2 (k,v) + 3*4*8 (mlp) = 144
    assert TINY.matmul_params_per_layer == 144
    # per seq, seq=3: linear 2*144*3=864, attention 2*1*2*2*3*3=72, last-token logits 2*4*10=80
    assert prefill_flops(TINY, batch=2, seq=3) == 2 * (864 + 72 + 80)
    # per seq, ctx=5: linear 288, attention 4*1*2*2*5=80, logits 80
    assert decode_flops(TINY, batch=3, ctx=5) == 3 * (288 + 80 + 80)


def test_tiny_bytes_literal():
    assert TINY.kv_bytes_per_token == 8
    # (4+4+2*2) + (4+4) + (4+2*8) + (8+4) elements per token
    assert TINY.activation_elems_per_token == 52
    # weights 2000 B; per seq: KV read 5 + write 1 token = 48 B, activations+logits (52+10)*2
    assert decode_bytes(TINY, batch=3, ctx=5) == 2000 + 3 * (48 + 124)
    # weights 2000 B; per seq: KV write 3 tokens = 24 B, activations 3*52*2 = 312 B
    assert prefill_bytes(TINY, batch=2, seq=3) == 2000 + 2 * (24 + 312)


def test_t_roof_compute_bound():
    # 1e12 FLOP at 100 TFLOP/s = 10 ms; 1e9 B at 1000 GB/s = 1 ms
    assert t_roof(1e12, 1e9, ROUND) == pytest.approx(0.01)


def test_t_roof_memory_bound():
    # 1e10 FLOP = 0.1 ms; 1e9 B = 1 ms
    assert t_roof(1e10, 1e9, ROUND) == pytest.approx(0.001)


def test_decode_memory_bound_and_prefill_compute_bound_on_real_shape():
    shape = ModelShape.from_hf_config(SMOLLM2_135M)
    step = decode_cost(shape, ctx=256)
    assert step.flops(1) / step.bytes(1) < ROUND.ridge_point
    assert t_decode_step(shape, ROUND, 1, 256) == pytest.approx(step.bytes(1) / 1e12)
    pre = prefill_cost(shape, seq=2048)
    assert pre.flops(8) / pre.bytes(8) > ROUND.ridge_point
    assert t_prefill(shape, ROUND, 8, 2048) == pytest.approx(pre.flops(8) / 1e14)


def test_stage_cost_vectorises_with_identical_floats():
    cost = decode_cost(ModelShape.from_hf_config(SMOLLM2_135M), ctx=100.5)
    batches = np.arange(1, 65)
    assert cost.time(batches, ROUND).tolist() == [cost.time(int(b), ROUND) for b in batches]


def test_shape_validation():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelShape(1, 4, 2, 0, 2, 8, 10, 2, 1000)
