"""Device profiles: the hardware numbers the roofline cost model needs.

A profile is one YAML file per device under ``conf/device/`` (a Hydra config group).
GPU profiles hold datasheet numbers; the CPU profile is measured on the machine by
:func:`tts.profiling.calibrate.calibrate_cpu`. A GPU profile also holds its measured
:class:`StepEfficiency`: how far a real engine step falls short of the datasheet roofline
(``python -m tts.profiling.step_fit``), which the trace replay prices steps with. A CUDA
card without a profile here gets its row of a datasheet table, or an estimate from its
properties (`tts.memory.gpus`).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

DEVICE_KINDS = ("cpu", "gpu")


@dataclass
class StepEfficiency:
    """A measured engine step against the datasheet roofline: a step of F FLOPs and B bytes
    on an L-layer model takes ``L * layer_us + max(F / (peak * compute), B / (bandwidth *
    memory))`` (`tts.metrics.step_cost.RooflineCost`), fitted to measured steps by
    :mod:`tts.profiling.step_fit`. Prefill is compute-bound, so `compute` prices it;
    decode is memory-bound up to a few hundred sequences (`memory`), compute-bound beyond.

    Measured: the H100 and the H200 (`docs/gpu/roofline_check_<gpu>.json`). A GPU never
    measured (the A100, the RTX 4090) borrows the H100's, saying so in `source`, over its
    own datasheet roofline: every GPU of a what-if is then priced the same way, and the
    H100's is the closer of the two fits; the shares an unmeasured card reaches are a guess
    either way, which `replay.step_costs=datasheet` brackets.

    Not frozen: it is also the `device.efficiency` node of the Hydra schema
    (`tts.config.schema.DeviceConfig`), which OmegaConf must be able to merge into."""

    compute: float
    """Share of ``peak_tflops`` a step's matmuls reach, in (0, 1]."""
    memory: float
    """Share of ``bandwidth_gbs`` a step's weight and KV reads reach, in (0, 1]."""
    layer_us: float
    """Microseconds per layer per step the kernels take beyond their FLOPs and bytes (norms,
    small kernels, one after another, even inside a CUDA graph); >= 0. Measured on
    28-layer models only: that it grows with the layers is an assumption."""
    source: str
    """The measurement: its file in this repository, the GPU and software, the fit's
    error; for a device never measured, whose efficiencies it borrows and why."""

    def __post_init__(self) -> None:
        for name in ("compute", "memory"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"device.efficiency.{name} must be in (0, 1], got {getattr(self, name)!r}")
        if not self.layer_us >= 0:
            raise ValueError(f"device.efficiency.layer_us must be >= 0, got {self.layer_us!r}")
        if not self.source.strip():
            raise ValueError("device.efficiency.source must name the measurement")


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
    efficiency: StepEfficiency | None = None
    """A GPU's measured step efficiencies; None where none was measured nor borrowed (the
    CPU, whose calibrated numbers are measured rates already): its steps are priced at
    the profile's numbers."""

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
    _check_keys("device", data, DeviceProfile)
    kw = dict(data)
    for key in ("peak_tflops", "bandwidth_gbs", "memory_gb"):
        if key in kw:
            kw[key] = float(kw[key])
    if kw.get("efficiency") is not None:
        _check_keys("device.efficiency", kw["efficiency"], StepEfficiency)
        eff = dict(kw["efficiency"])
        kw["efficiency"] = StepEfficiency(**{k: v if k == "source" else float(v) for k, v in eff.items()})
    return DeviceProfile(**kw)


def _check_keys(where: str, data: dict[str, Any], cls: type) -> None:
    """ValueError naming `data`'s keys that `cls` lacks, or the ones it needs that `data` lacks."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown}; valid keys: {sorted(known)}")
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")


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
