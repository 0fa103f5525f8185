"""``tts profile-memory``: per-model memory breakdown and a sweep of the KV split.

Prints, for a run config: each model's weights and KV bytes per token, how many of its
requests the budget holds, the modelled total time of static splits from 10% to 90%
generator share, and the roofline search's choice. ``--calibrate`` first measures this
CPU and rewrites ``conf/device/cpu.yaml``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tts.memory.allocator import Allocation, Workload, evaluate_allocation, search_allocation
from tts.memory.calibrate import calibrate_and_write
from tts.memory.device import DeviceProfile, device_from_dict
from tts.memory.roofline import ModelShape

if TYPE_CHECKING:
    from rich.console import Console

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


def _device(cfg: Any, calibrate: bool, console: Console) -> DeviceProfile:
    device = device_from_dict(dict(cfg.device))
    if calibrate:
        measured = calibrate_and_write()
        console.print(f"calibrated: {measured.peak_tflops * 1e3:.1f} GFLOP/s, "
                      f"{measured.bandwidth_gbs:.1f} GB/s, {measured.memory_gb:.1f} GB -> conf/device/cpu.yaml")
        if device.kind == "cpu":
            device = measured
    return device


def _model_table(shapes: dict[str, ModelShape], kv_per_request: dict[str, int], budget: int) -> Any:
    from rich.table import Table

    table = Table(title=f"models (KV budget {budget / GIB:.2f} GiB)")
    for col in ("role", "params", "weights GiB", "KV B/token", "KV per request", "requests in budget"):
        table.add_column(col)
    for role, shape in shapes.items():
        table.add_row(role, f"{shape.num_params / 1e6:.1f}M", f"{shape.weight_bytes / GIB:.3f}",
                      str(shape.kv_bytes_per_token), f"{kv_per_request[role] / 2**20:.2f} MiB",
                      str(budget // kv_per_request[role]))
    return table


def _sweep_table(rows: list[tuple[str, Allocation | None]], workload: Workload) -> Any:
    from rich.table import Table

    table = Table(title=f"KV split sweep: N={workload.num_requests}, S={workload.verifier_seq_len}, "
                        f"S_dec={workload.decode_len}")
    for col in ("split", "B_pre", "B_dec", "T_verifier s", "T_generator s", "T_total s", "mode"):
        table.add_column(col)
    for label, a in rows:
        cells = ("-",) * 6 if a is None else (str(a.b_pre), str(a.b_dec), f"{a.t_verifier:.4f}",
                                              f"{a.t_generator:.4f}", f"{a.t_total:.4f}", a.mode)
        table.add_row(label, *cells)
    return table


def profile_memory(cfg: Any, calibrate: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Print the memory breakdown and the modelled split sweep for ``cfg``.

    ``cfg`` is a composed run config (``generator``, ``verifier``, ``device``, ``memory``,
    ``search``, ``bench``, optionally ``profile.splits``). The workload is the run's peak:
    ``search.n * bench.concurrency`` beams at half the maximum path length, as in the
    planner. Returns a JSON-ready dict (``breakdown``, ``sweep`` rows keyed by
    ``generator_fraction``, ``roofline``) in the shape the report reads from ``profile.json``.
    """
    from rich.console import Console

    from tts.memory.planner import model_shape, workload_for

    console = console or Console()
    device = _device(cfg, calibrate, console)
    shapes = {"generator": model_shape(cfg.generator.model), "verifier": model_shape(cfg.verifier.model)}
    workload = workload_for(cfg, cfg.search.n * cfg.bench.concurrency, cfg.generator.max_total_tokens // 2)
    budget = int(cfg.memory.kv_cache_gib * GIB)
    kv = {"generator": workload.kv_generator(shapes["generator"]), "verifier": workload.kv_verifier(shapes["verifier"])}
    console.print(f"device {device.name}: {device.peak_tflops} TFLOP/s, {device.bandwidth_gbs} GB/s ({device.source})")
    console.print(_model_table(shapes, kv, budget))
    gen, ver = shapes["generator"], shapes["verifier"]
    best = search_allocation(gen, ver, device, workload, budget)
    profile_cfg = getattr(cfg, "profile", None)
    fractions = tuple(profile_cfg.splits) if profile_cfg is not None else FRACTIONS
    sweep = static_sweep(gen, ver, device, workload, budget, fractions)
    rows = [(f"static {f:.0%} gen", a) for f, a in sweep]
    console.print(_sweep_table(rows + [("roofline search", best)], workload))
    return {
        "device": device.to_dict(),
        "workload": asdict(workload),
        "kv_budget_bytes": budget,
        "breakdown": {role: {"num_params": s.num_params, "weight_bytes": s.weight_bytes,
                             "kv_bytes_per_token": s.kv_bytes_per_token, "kv_bytes_per_request": kv[role]}
                      for role, s in shapes.items()},
        "sweep": [{"generator_fraction": f, **_alloc_row(a)} for f, a in sweep if a is not None],
        "roofline": None if best is None else {"generator_fraction": best.kv_bytes_generator / budget,
                                               **_alloc_row(best)},
    }


def _alloc_row(a: Allocation) -> dict[str, float | int]:
    return {"b_pre": a.b_pre, "b_dec": a.b_dec, "model_t_total_s": a.t_total,
            "model_t_verifier_s": a.t_verifier, "model_t_generator_s": a.t_generator}
