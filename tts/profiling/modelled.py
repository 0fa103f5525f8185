"""The roofline model's view of the split sweep, next to the measured one.

For each static generator share the model gives the batch sizes the KV budget holds and
the modelled total time (FlashTTS's T_tot); the roofline search gives its own choice.
Needs only the models' ``config.json`` and the device profile, no engine.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tts.memory.allocator import Allocation, Workload, evaluate_allocation, search_allocation
from tts.memory.device import DeviceProfile
from tts.memory.roofline import ModelShape

GIB = 2**30
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def static_sweep(gen: ModelShape, ver: ModelShape, device: DeviceProfile, workload: Workload,
                 budget: int, fractions: tuple[float, ...] = FRACTIONS) -> list[tuple[float, Allocation | None]]:
    """Modelled allocation of each static generator share; ``None`` where a side holds no request."""
    rows: list[tuple[float, Allocation | None]] = []
    for f in fractions:
        gen_cap = int(budget * f) // workload.kv_generator(gen)
        ver_cap = (budget - int(budget * f)) // workload.kv_verifier(ver)
        ok = gen_cap >= 1 and ver_cap >= 1
        rows.append((f, evaluate_allocation(gen, ver, device, workload, ver_cap, gen_cap) if ok else None))
    return rows


def alloc_row(a: Allocation) -> dict[str, float | int]:
    """The modelled numbers of one allocation, JSON-ready."""
    return {"b_pre": a.b_pre, "b_dec": a.b_dec, "model_t_total_s": a.t_total,
            "model_t_verifier_s": a.t_verifier, "model_t_generator_s": a.t_generator}


def modelled_sweep(gen: ModelShape, ver: ModelShape, device: DeviceProfile, workload: Workload,
                   budget: int, fractions: tuple[float, ...]) -> dict[str, Any]:
    """The modelled static sweep and the roofline search's choice, JSON-ready.

    ``rows`` holds one entry per share that fits at least one request on each side.
    """
    sweep = static_sweep(gen, ver, device, workload, budget, fractions)
    best = search_allocation(gen, ver, device, workload, budget)
    return {
        "device": device.to_dict(),
        "workload": asdict(workload),
        "kv_budget_bytes": budget,
        "shapes": {"generator": _shape_row(gen, workload.kv_generator(gen)),
                   "verifier": _shape_row(ver, workload.kv_verifier(ver))},
        "rows": [{"generator_fraction": f, **alloc_row(a)} for f, a in sweep if a is not None],
        "roofline": None if best is None else {"generator_fraction": best.kv_bytes_generator / budget,
                                               **alloc_row(best)},
    }


def _shape_row(shape: ModelShape, kv_per_request: int) -> dict[str, int]:
    return {"num_params": shape.num_params, "weight_bytes": shape.weight_bytes,
            "kv_bytes_per_token": shape.kv_bytes_per_token, "kv_bytes_per_request": kv_per_request}


def model_for_config(cfg: Any, device: DeviceProfile, fractions: tuple[float, ...]) -> dict[str, Any] | None:
    """`modelled_sweep` for a validated run config on `device`; None when a model has no
    readable shape (the fake backend, or a model folder that is not present)."""
    from tts.assembly.memory_split import model_shape, workload_for

    try:
        gen = model_shape(cfg.generator.model, cfg.generator.dtype)
        ver = model_shape(cfg.verifier.model, cfg.verifier.dtype)
    except (FileNotFoundError, KeyError, ValueError):
        return None
    workload = workload_for(cfg, cfg.search.n * cfg.bench.concurrency, cfg.generator.max_total_tokens // 2)
    budget = int(cfg.memory.kv_cache_gib * GIB)
    return modelled_sweep(gen, ver, device, workload, budget, fractions)
