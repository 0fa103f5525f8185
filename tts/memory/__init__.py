"""Memory model: device profiles, the roofline cost model and the KV allocation search.

Layers, bottom up:

- ``device``: :class:`DeviceProfile` and the ``conf/device/*.yaml`` profiles.
- ``gpus``: every CUDA card's profile by its name (a datasheet table), or estimated from
  its properties.
- ``roofline``: :class:`ModelShape` and FLOP/byte/time estimates of prefill and decode.
- ``allocator``: FlashTTS's (B_pre, B_dec) search under a shared KV budget.
- ``policy``: the KV-split policies the engine calls, chosen by name.

Only the model lives here: nothing imports a backend, torch or vLLM. Applying the split to
a run's engines is `tts.assembly.memory_split`; measuring this CPU into a device profile
(`calibrate`) and the `profile-memory` verb are `tts.profiling`; the allocation search's
timing is `python -m tts.benchmarks.allocator_timing`.

Names are re-exported lazily (PEP 562), so importing the package costs nothing.
"""

from importlib import import_module
from typing import Any

_EXPORTS: dict[str, str] = {
    "Allocation": "allocator",
    "Workload": "allocator",
    "brute_force_allocation": "allocator",
    "search_allocation": "allocator",
    "DeviceProfile": "device",
    "available_devices": "device",
    "device_from_dict": "device",
    "load_device": "device",
    "ALLOCATION_POLICIES": "policy",
    "AllocationPolicy": "policy",
    "KVSplit": "policy",
    "RooflineSplit": "policy",
    "StaticSplit": "policy",
    "make_allocation_policy": "policy",
    "ModelShape": "roofline",
    "StageCost": "roofline",
    "decode_bytes": "roofline",
    "decode_cost": "roofline",
    "decode_flops": "roofline",
    "prefill_bytes": "roofline",
    "prefill_cost": "roofline",
    "prefill_flops": "roofline",
    "t_decode_step": "roofline",
    "t_prefill": "roofline",
    "t_roof": "roofline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tts.memory' has no attribute {name!r}")
    return getattr(import_module(f"tts.memory.{_EXPORTS[name]}"), name)
