"""Overlap on the vLLM route, without a GPU: with CUDA simulated (torch's CUDA queries
answer as a card's would) and `vllm.LLM` replaced by a recorder of the arguments `make_llm`
passes it (no engine starts, no vLLM behaviour is imitated), a run's engines are built with
vLLM's asynchronous scheduling and still in this process; without CUDA it is refused."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vLLM is not installed")]

SMOL_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "hidden_size": 576, "torch_dtype": "bfloat16",
               "max_position_embeddings": 8192}


class _Built:
    """What `vllm.LLM(...)` returned to `make_llm`: only its arguments matter here."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A config-only model folder, `vllm.LLM` recording its arguments, the V1 multiprocessing
    variable unset (make_llm sets it), and CUDA answered as on a card: (folder, built)."""
    import torch
    import vllm
    import vllm.envs as envs

    (tmp_path / "config.json").write_text(json.dumps(SMOL_CONFIG))
    made: list[_Built] = []
    monkeypatch.setattr(vllm, "LLM", lambda **kw: made.append(_Built(**kw)) or made[-1])
    monkeypatch.setattr(envs, "__getattr__", lambda name: envs.environment_variables[name]())
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # recorded, so the test's change is undone
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (60 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    return str(tmp_path), made


def test_the_gpu_route_builds_engines_with_asynchronous_scheduling_in_this_process(built, monkeypatch):
    """`generator.overlap=auto` on CUDA: the generator's engine gets `async_scheduling=True`
    and is built with `VLLM_ENABLE_V1_MULTIPROCESSING=0`, so its engine core, scheduler and
    model runner stay in this process for every hook in `internals.py`; the judge verifier
    likewise; `off` builds the synchronous engine."""
    from tts.backends import factory
    from tts.backends.vllm import generator as vllm_generator
    from tts.config.compose import compose, validate

    folder, made = built
    monkeypatch.setattr(vllm_generator, "VllmGenerator", lambda llm, resumable_sampling: llm)
    models = [f"generator.model={folder}", f"verifier.model={folder}"]
    for overlap in ("auto", "on", "off"):
        cfg = validate(compose("config", [*models, f"generator.overlap={overlap}", f"verifier.overlap={overlap}"]))
        gen_spec, ver_spec = factory.static_split(cfg)
        backends = factory.Backends(cfg)
        llm = backends._make_generator(gen_spec)
        assert llm is made[-1] and llm.kwargs["async_scheduling"] is (overlap != "off")
        assert llm.multiprocessing == "0"  # the in-process engine: InprocClient, the hooks' route
        backends._llm(cfg.verifier.model, "auto", ver_spec, 1024, overlap=factory.resolve_overlap(cfg, "verifier"))
        assert made[-1].kwargs["async_scheduling"] is (overlap != "off") and made[-1].multiprocessing == "0"


def test_asynchronous_scheduling_without_cuda_is_refused_before_vllm_is_called(built, monkeypatch):
    """On a CPU vLLM would switch asynchronous scheduling off and say nothing: `make_llm`
    refuses it in one line instead, and no engine is built."""
    import torch

    from tts.backends.vllm.engine import make_llm

    folder, made = built
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^async_scheduling: vLLM runs asynchronous scheduling on CUDA only"):
        make_llm(folder, kv_cache_bytes=64 << 20, gpu_memory_utilization=None, block_size=32, max_num_seqs=4,
                 max_num_batched_tokens=1024, dtype="float32", seed=0, min_tokens_per_seq=1024,
                 async_scheduling=True)
    assert made == []
