"""The device profile a run prices on this host (`on_this_host`): a CUDA card's, or this
CPU's own calibration (`tts.profiling.calibrate`), or a resumed run's recorded one."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tts.config.enums import BackendKind
from tts.results.store import RunStore

log = logging.getLogger(__name__)


def on_this_host(cfg_node: DictConfig) -> DictConfig:
    """`cfg_node` with `device` this machine's own profile where the configured one is a
    CPU's, for a run whose generator is vLLM here: on a CUDA host (`models_on_cuda`) its
    card's profile (`tts.profiling.gpu.gpu_profile`: its datasheet's, else its calibration,
    else an estimate from its properties; `device: cpu` is the default, so a GPU run that
    names no device gets its card's); on a CPU, this CPU's own calibration where the
    configured one was measured on another CPU (`host_profile`). A GPU profile given
    (`device=h100`) is kept. The run folder's config records the profile used."""
    backend = cfg_node.generator.backend
    if cfg_node.device.kind != "cpu" or getattr(backend, "value", backend) != BackendKind.vllm.value:
        return cfg_node
    import copy
    from dataclasses import fields

    from tts.backends.factory import models_on_cuda
    from tts.backends.vllm.engine import resolve_dtype
    from tts.memory.device import device_from_dict
    from tts.profiling.calibrate import host_profile
    from tts.profiling.gpu import gpu_profile

    configured = device_from_dict(OmegaConf.to_container(cfg_node.device, resolve=True))
    if models_on_cuda(cfg_node):
        profile, note = gpu_profile(configured)
    else:
        dtype = resolve_dtype(cfg_node.generator.dtype, {"torch_dtype": "bfloat16"})  # what the run prices
        profile, note = _resumed_device(cfg_node, configured, dtype) or host_profile(configured, dtype=dtype)
    if note is None:
        return cfg_node
    log.warning(note)
    cfg_node = copy.deepcopy(cfg_node)
    for f in fields(profile):  # `efficiency` as its dataclass: the typed node takes no plain dict
        cfg_node.device[f.name] = getattr(profile, f.name)
    return cfg_node


def _resumed_device(cfg_node: DictConfig, configured, dtype: str):
    """A resumed run's own CPU profile, with a note where it is not `configured`: its
    speculation width and memory split stay those of its first part, on this CPU (a
    measurement that differs by a hair does not refuse the resume as "other settings") or
    on another (a long run resumed on other machines, `bench.chunk`); None for a new run,
    or one that recorded no CPU profile. `dtype`: the one the run's models run in."""
    if not (cfg_node.bench.resume and cfg_node.bench.run_name):
        return None
    from tts.memory.device import device_from_dict
    from tts.profiling.calibrate import this_host

    try:  # a corrupt config.yaml is reported when the run folder opens
        saved = RunStore(Path(cfg_node.bench.results_dir) / cfg_node.bench.run_name).saved_config().get("device")
        recorded = device_from_dict(saved) if isinstance(saved, dict) else None
    except (TypeError, ValueError):
        return None
    if recorded is None or recorded.kind != "cpu":
        return None
    if recorded == configured:
        return recorded, None
    here = this_host(dtype)
    if recorded.host == here:
        return recorded, f"device=cpu: --resume keeps the profile its run measured on {recorded.host}"
    return recorded, (f"device=cpu: --resume keeps the profile its run measured on {recorded.host} (this host is "
                      f"{here}): the speculation width and memory split stay those of the run's first part; "
                      "its speeds are this host's (records carry their host)")
