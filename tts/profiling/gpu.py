"""This host's CUDA card as a device profile: its datasheet profile, else its calibration,
else an estimate from its properties; and `tts profile-memory --calibrate` on a GPU, which
measures the card and keeps the numbers for the runs on it. torch is imported lazily."""

from __future__ import annotations

import datetime as _dt
import hashlib
from pathlib import Path

from tts.memory.device import DeviceProfile, device_from_dict
from tts.memory.gpus import CardProperties, card_slug, estimate_profile, gpu_by_name


def card_properties() -> CardProperties:
    """The current CUDA device as torch describes it; 0 for what this torch does not give
    (the clocks and the bus width are absent from some versions)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())

    def number(name: str) -> int:
        value = getattr(props, name, 0)
        return int(value) if isinstance(value, (int, float)) else 0

    return CardProperties(name=str(props.name), major=int(props.major), minor=int(props.minor),
                          sm_count=int(props.multi_processor_count), total_memory=int(props.total_memory),
                          clock_khz=number("clock_rate"), memory_clock_khz=number("memory_clock_rate"),
                          bus_width_bits=number("memory_bus_width"))


def gpu_profile(profile: DeviceProfile, cache: Path | None = None) -> tuple[DeviceProfile, str]:
    """On a CUDA host, its card's profile in place of the CPU profile `profile`, with a note:
    the models run on the GPU, so a CPU's numbers would size the memory split and the
    speculation width of a GPU run. The card's datasheet profile by its name
    (`tts.memory.gpus.gpu_by_name`); for a card the table lacks, its calibration kept in
    `cache` (`calibrate_gpu_and_keep`), else an estimate from its properties, labelled so."""
    from tts.backends.vllm.engine import gpu_name

    card = gpu_name()
    known = gpu_by_name(card)
    head = f"device={profile.name}: this host runs the models on a GPU ({card})"
    if known is not None:
        return known, f"{head}: using the {known.name} profile (give device=... to choose another)"
    kept = kept_calibration(card, cache)
    if kept is not None:
        return kept, (f"{head}, which no datasheet profile describes: using its calibration ({kept.peak_tflops:g} "
                      f"TFLOP/s, {kept.bandwidth_gbs:g} GB/s; {calibration_path(card, cache)})")
    guess = estimate_profile(card_properties())
    return guess, (f"{head}, which no datasheet profile describes: using an ESTIMATE from its properties "
                   f"({guess.name}: {guess.peak_tflops:g} TFLOP/s, {guess.bandwidth_gbs:g} GB/s); measure it with "
                   "`tts profile-memory --calibrate`, or give device=...")


def calibration_path(card: str, cache: Path | None = None) -> Path:
    """Where the calibration of the card called `card` is kept: `cache`, else `device/`
    beside the model cache, as a CPU's (`tts.profiling.calibrate.host_profile`)."""
    from tts.profiling.calibrate import host_cache

    return host_cache(cache) / f"gpu-{hashlib.sha1(card.encode()).hexdigest()[:12]}.yaml"


def kept_calibration(card: str, cache: Path | None = None) -> DeviceProfile | None:
    """The calibration kept for the card called `card`; None without one (or a corrupt one,
    which the next calibration replaces)."""
    import yaml

    path = calibration_path(card, cache)
    if not path.is_file():
        return None
    try:
        kept = device_from_dict(yaml.safe_load(path.read_text()))
    except (ValueError, TypeError, AttributeError, yaml.YAMLError):
        return None
    return kept if kept.kind == "gpu" and kept.calibrated and kept.host == card else None


def measure(device: str, dtype_name: str, seconds: float, n: int, copy_mib: int) -> tuple[float, float]:
    """(matmul TFLOP/s, copy GB/s) on torch device `device`: an `n`^3 matmul in `dtype_name`
    and a `copy_mib` MiB copy (bytes read and written), each its 20th-percentile time of the
    repeats `seconds` / 2 allows, the device synchronised after each."""
    import torch

    from tts.profiling.calibrate import best_time

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a = torch.randn(n, n, device=device).to(getattr(torch, dtype_name))
    b = torch.randn(n, n, device=device).to(getattr(torch, dtype_name))
    matmul, _ = best_time(lambda: (torch.mm(a, b), sync()), seconds / 2)
    src = torch.ones(copy_mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy, _ = best_time(lambda: (dst.copy_(src), sync()), seconds / 2)
    return 2 * n**3 / matmul / 1e12, 2 * src.numel() * src.element_size() / copy / 1e9


def calibrate_gpu(seconds: float = 2.0, n: int = 8192, copy_mib: int = 1024) -> DeviceProfile:
    """Measure this host's CUDA card: a `<card>_calibrated` profile whose peak is its bf16
    matmul rate (fp16 before compute capability 8.0) and bandwidth its copy rate, with no
    step efficiencies (the rates are measured ones already, as a CPU's are)."""
    import torch

    card = card_properties()
    dtype = "bfloat16" if card.major >= 8 else "float16"
    tflops, gbs = measure("cuda", dtype, seconds, n, copy_mib)
    torch.cuda.empty_cache()
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = (f"calibrated by tts.profiling.gpu.calibrate_gpu on {card.name} (torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}) at {when}: {n}^3 {dtype} matmul {tflops:.1f} TFLOP/s, {copy_mib} MiB device "
              f"copy {gbs:.0f} GB/s (read+write bytes), each the 20th-percentile time of repeats")
    return DeviceProfile(f"{card_slug(card.name)}_calibrated", "gpu", round(tflops, 3), round(gbs, 1),
                         round(card.total_memory / 1e9, 1), source, calibrated=True, host=card.name)


def calibrate_gpu_and_keep(cache: Path | None = None) -> tuple[DeviceProfile, Path]:
    """Calibrate this host's card and keep the profile where `gpu_profile` finds it."""
    from tts.profiling.calibrate import write_profile

    profile = calibrate_gpu()
    return profile, write_profile(profile, calibration_path(profile.host, cache))
