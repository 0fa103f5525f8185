"""Measure a CPU's roofline numbers (matmul rate, memory bandwidth, memory size).

Backs ``tts profile-memory --calibrate`` on a CPU: :func:`calibrate_and_write` measures this
machine and writes ``conf/device/cpu.yaml`` (a CUDA card: `tts.profiling.gpu`). torch is
imported lazily.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from tts.memory.device import DeviceProfile, device_dir


def total_memory_gb() -> float:
    """Physical memory in GB (10^9 bytes), from /proc/meminfo or sysconf."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 1e9  # the file says kB, it means KiB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def best_time(fn: Callable[[], object], budget_s: float, min_repeats: int = 3) -> tuple[float, int]:
    """Near-best wall time of ``fn`` over repeats until ``budget_s`` is spent (after a warm-up).

    Returns the 20th-percentile time (the minimum when there are fewer than five repeats):
    on a shared VM the single fastest run is occasionally a timing outlier.
    """
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 5], len(times)


def measure_bandwidth_gbs(budget_s: float = 1.0, mib: int = 256) -> float:
    """Copy bandwidth in GB/s: (bytes read + bytes written) / best copy time.

    The buffer should be far larger than the last-level cache; torch's ``copy_`` uses all
    intra-op threads, which a single-threaded numpy copy would not.
    """
    import torch

    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    best, _ = best_time(lambda: dst.copy_(src), budget_s)
    return 2 * src.numel() * src.element_size() / best / 1e9


def measure_matmul_tflops(dtype_name: str, budget_s: float = 0.5, n: int = 2048) -> float:
    """Square ``n x n`` matmul rate in TFLOP/s for ``dtype_name`` (FLOPs = 2 n^3), best of repeats."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    best, _ = best_time(lambda: torch.mm(a, b), budget_s)
    return 2 * n**3 / best / 1e12


def _threads() -> int:
    """The CPUs this process may use (its torch threads while calibrating)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def this_host(dtype: str | None = None) -> str:
    """What a CPU profile's numbers depend on: the CPU model, the threads that ran them and
    the dtype priced (`dtype`, the one the run's models run in; None: the one a bf16 model
    runs in here by default). One marketing name, "AMD EPYC", covers Zen 2 without native
    bf16 and Zen 4 with it, and a float32 run on the latter is priced at float32."""
    from tts.backends.vllm.engine import resolve_dtype
    from tts.results.host import cpu_model

    return f"{cpu_model()}, {_threads()} threads, {dtype or resolve_dtype('auto', {'torch_dtype': 'bfloat16'})}"


def _busy_cpu_seconds() -> float:
    """CPU-seconds spent busy by the whole machine (all CPUs), from /proc/stat; 0 if absent."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return 0.0
    ticks = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _measure(seconds: float, matmul_n: int, copy_mib: int) -> tuple[float, dict[str, float], int, float]:
    """(bandwidth GB/s, TFLOP/s by dtype, threads, share of the CPUs other processes used)."""
    import torch

    threads_before = torch.get_num_threads()
    threads = _threads()
    torch.set_num_threads(threads)
    busy0, own0, wall0 = _busy_cpu_seconds(), sum(os.times()[:2]), time.perf_counter()
    try:
        bandwidth = measure_bandwidth_gbs(seconds / 2, copy_mib)
        rates = {d: measure_matmul_tflops(d, seconds / 4, matmul_n) for d in ("bfloat16", "float32")}
    finally:
        torch.set_num_threads(threads_before)
    others = (_busy_cpu_seconds() - busy0) - (sum(os.times()[:2]) - own0)
    other_share = max(0.0, others / ((time.perf_counter() - wall0) * (os.cpu_count() or 1)))
    return bandwidth, rates, threads, other_share


def calibrate_cpu(seconds: float = 2.0, matmul_n: int = 2048, copy_mib: int = 256) -> DeviceProfile:
    """Measure this machine and return a ``cpu`` profile with ``calibrated=True``.

    Half of ``seconds`` goes to the copy-bandwidth test, the rest is shared by the bf16 and
    fp32 matmul tests. ``peak_tflops`` is the rate of the dtype a bf16 model runs in here
    (``resolve_dtype("auto")``: bf16 on a CPU with native bf16, float32 where bf16 is
    emulated), so the roofline prices the matmuls the engines really do. All CPUs the process may use
    are used as torch threads, so run it on an otherwise idle machine: the share of CPU
    time other processes took during the run is recorded in ``source``.
    """
    return _calibrate(seconds, matmul_n, copy_mib)[0]


def _calibrate(seconds: float, matmul_n: int, copy_mib: int,
               dtype: str | None = None) -> tuple[DeviceProfile, float]:
    """`calibrate_cpu`'s profile (its peak at `dtype`, None: the one a bf16 model runs in
    here), and the share of the CPUs other processes used meanwhile."""
    import torch

    from tts.backends.vllm.engine import resolve_dtype

    bandwidth, rates, threads, other_share = _measure(seconds, matmul_n, copy_mib)
    here = this_host(dtype)
    best_dtype = dtype if dtype in rates else resolve_dtype("auto", {"torch_dtype": "bfloat16"})
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rate_text = ", ".join(f"{d} {r * 1e3:.1f} GFLOP/s" for d, r in rates.items())
    source = (
        f"calibrated by tts.profiling.calibrate.calibrate_cpu on host {socket.gethostname()} "
        f"({here}, torch {torch.__version__}) at {when}: "
        f"{matmul_n}^3 matmul 20th-percentile time of repeats {rate_text} (peak = {best_dtype}, the dtype the models run in); "
        f"{copy_mib} MiB torch copy, read+write bytes; other processes used "
        f"{other_share:.0%} of the CPUs during the run"
    )
    return DeviceProfile(
        name="cpu",
        kind="cpu",
        peak_tflops=round(rates[best_dtype], 6),
        bandwidth_gbs=round(bandwidth, 3),
        memory_gb=round(total_memory_gb(), 3),
        source=source,
        calibrated=True,
        host=here,
    ), other_share


def write_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write ``profile`` as a Hydra device YAML (the ``conf/device/*.yaml`` keys)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Device profile '{profile.name}'. Written by tts.profiling.calibrate.write_profile.\n"
        "# peak_tflops: dense matmul TFLOP/s; bandwidth_gbs: GB/s; memory_gb: GB (1e9 bytes).\n"
    )
    body = yaml.safe_dump(profile.to_dict(), sort_keys=False, width=10_000)
    path.write_text(header + body)
    return path


def calibrate_and_write(path: str | Path | None = None, seconds: float = 2.0) -> DeviceProfile:
    """Calibrate this CPU and write the profile (default ``conf/device/cpu.yaml``)."""
    profile = calibrate_cpu(seconds)
    write_profile(profile, path if path is not None else device_dir() / "cpu.yaml")
    return profile


BUSY_SHARE = 0.2  # above this share of the CPUs used by others, a calibration is not kept


def host_cache(cache: Path | None) -> Path:
    """Where this host's calibration is kept: `cache`, else `device/` beside the model cache."""
    if cache is not None:
        return cache
    from tts.models.cache import cache_dir

    return cache_dir().parent / "device"


def host_profile(profile: DeviceProfile, cache: Path | None = None,
                 dtype: str | None = None) -> tuple[DeviceProfile, str | None]:
    """The CPU profile a run on this machine prices its roofline with, and a note when it
    is not `profile`.

    `conf/device/cpu.yaml` is one machine's calibration. The decode ridge batch (the
    speculation width of `optim.spec_batch_cap=-1`) and the roofline memory split follow
    from it, and CPUs differ by more than an order of magnitude there: an AMD EPYC without
    native bf16 computes float32 at ~0.13 TFLOP/s, an Intel Xeon with AMX bf16 at ~2.7, so
    a ridge batch of 11 on one is 99 on the other. A calibrated CPU profile measured on
    another CPU (`host`) is therefore replaced by this CPU's own calibration, measured once
    (a few seconds, before any model loads) and kept in `cache` (default
    `~/.cache/tts/device/`), keyed by CPU model, threads and `dtype` (the one the run's
    models run in; None: a bf16 model's default here). GPU profiles (datasheet
    numbers), hand-typed ones (`calibrated: false`) and profiles from before `host` was
    recorded are used as they are.
    """
    import hashlib

    import yaml

    from tts.memory.device import device_from_dict

    here = this_host(dtype)
    if profile.kind != "cpu" or not profile.calibrated or not profile.host or profile.host == here:
        return profile, None
    path = host_cache(cache) / f"cpu-{hashlib.sha1(here.encode()).hexdigest()[:12]}.yaml"
    measured = None
    if path.is_file():
        try:
            measured = device_from_dict(yaml.safe_load(path.read_text()))
        except (ValueError, TypeError, yaml.YAMLError):
            pass  # a corrupt cache entry is measured again
    if measured is None or measured.host != here:
        measured, busy = _calibrate(2.0, 2048, 256, dtype)
        if busy <= BUSY_SHARE:  # a busy machine's numbers serve this run, not the next ones
            try:
                write_profile(measured, path)
            except OSError:  # an unwritable cache: the next run measures again
                pass
    note = (f"device=cpu: the profile was calibrated on {profile.host}; this host is {here}: using its own "
            f"calibration ({measured.peak_tflops * 1e3:.0f} GFLOP/s, {measured.bandwidth_gbs:.1f} GB/s, "
            f"ridge {measured.ridge_point:.1f} FLOP/byte; {path})")
    return measured, note
