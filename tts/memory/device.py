"""Device profiles: the hardware numbers the roofline cost model needs.

A profile is one YAML file per device under ``conf/device/`` (a Hydra config group).
GPU profiles hold datasheet numbers; the CPU profile is measured on the machine by
:func:`tts.profiling.calibrate.calibrate_cpu`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

DEVICE_KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class DeviceProfile:
    """Peak compute, memory bandwidth and memory size of one device."""

    name: str
    """Short identifier, e.g. ``h100``; also the YAML file name in ``conf/device/``."""
    kind: str
    """``cpu`` or ``gpu``."""
    peak_tflops: float
    """Dense bf16 matmul peak in TFLOP/s (no 2:4 sparsity); measured for a CPU."""
    bandwidth_gbs: float
    """Peak memory bandwidth in GB/s (10^9 bytes per second)."""
    memory_gb: float
    """Device memory in GB (10^9 bytes); nominal datasheet capacity for a GPU."""
    source: str
    """Where the numbers come from: datasheet title and URL, or calibration host/date."""
    calibrated: bool = False
    """True when the numbers were measured on the machine, not copied from a datasheet."""
    host: str = ""
    """For a calibrated CPU profile: the CPU it was measured on (model, threads, the dtype
    bf16 models run in), so a run on another CPU measures its own
    (:func:`tts.profiling.calibrate.host_profile`)."""

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"DeviceProfile.kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        for name in ("peak_tflops", "bandwidth_gbs", "memory_gb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DeviceProfile.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.source.strip():
            raise ValueError("DeviceProfile.source must name where the numbers come from")

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a kernel is compute-bound."""
        return self.peak_tflops * 1e12 / (self.bandwidth_gbs * 1e9)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the YAML keys, in field order."""
        return asdict(self)


def device_dir() -> Path:
    """The ``conf/device`` folder that holds one YAML per device."""
    import conf

    return Path(conf.__file__).resolve().parent / "device"


def available_devices() -> list[str]:
    """Names of the device profiles shipped in ``conf/device``."""
    return sorted(p.stem for p in device_dir().glob("*.yaml"))


def device_from_dict(data: dict[str, Any]) -> DeviceProfile:
    """Build a profile from a mapping (a loaded YAML or a Hydra ``cfg.device``).

    Unknown keys raise ``ValueError`` so that a typo in a config is not silently dropped.
    """
    known = {f.name for f in fields(DeviceProfile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown device keys {unknown}; valid keys: {sorted(known)}")
    kw = dict(data)
    for key in ("peak_tflops", "bandwidth_gbs", "memory_gb"):
        if key in kw:
            kw[key] = float(kw[key])
    return DeviceProfile(**kw)


def load_device(name_or_path: str | Path) -> DeviceProfile:
    """Load a device profile by name (``"h100"``) or from a YAML file path."""
    import yaml

    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = device_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown device {name_or_path!r}; valid: {available_devices()}")
    with path.open() as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of device fields")
    return device_from_dict(data)


# CUDA device names (`torch.cuda.get_device_name()`) -> the profile in conf/device. The
# profiles hold the datasheet numbers of one variant each (A100 80GB SXM, H100 SXM, H200
# SXM, RTX 4090); variants with other bandwidth or compute (PCIe cards, the 40 GB A100)
# are not matched, so their runs name a profile themselves instead of borrowing another's.
GPU_PROFILES: tuple[tuple[str, str], ...] = (
    (r"\bH200\b", "h200"),  # "NVIDIA H200" (not GH200: Grace Hopper is another memory system)
    (r"\bH100\b(?!.*PCIe)", "h100"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100\b(?!.*(PCIe|40GB))", "a100"),  # "NVIDIA A100-SXM4-80GB"
    (r"\bRTX 4090\b", "rtx4090"),  # "NVIDIA GeForce RTX 4090"
)


def profile_for_gpu(gpu_name: str) -> str:
    """The `conf/device` profile of the CUDA device called `gpu_name`; ValueError naming
    the card and the `device=` choices when none matches."""
    for pattern, profile in GPU_PROFILES:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return profile
    gpus = [name for name in available_devices() if name != "cpu"]
    raise ValueError(f"device: no profile matches this GPU ({gpu_name!r}); give the closest one on the "
                     f"command line, device=<one of {', '.join(gpus)}>, or add conf/device/<name>.yaml "
                     "with its datasheet numbers")
