"""A GPU's measured step efficiencies (`tts.memory.device.StepEfficiency`), fitted to the
engine steps `docs/gpu/roofline_check.py` timed on it:

    python -m tts.profiling.step_fit docs/gpu/roofline_check_h200.json

prints the `efficiency:` block of the device's profile (`conf/device/<gpu>.yaml`) and each
step measured against its price under both `replay.step_costs` (no launch: the check times
the kernels alone).

The fit: the three numbers (compute and memory share of the datasheet, microseconds per
layer) that minimise the root mean square of log(price / measured) over every step of the
file, on a grid of 0.01 and 1 us (`GRID`), so the same file always gives the same numbers.
A step's FLOPs and bytes are the replay's own (`tts.metrics.step_cost.RooflineCost.work`), on the
model shapes the check ran (`tts.benchmarks.allocator_timing.SHAPES`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from tts.markdown import markdown_table
from tts.memory.device import DeviceProfile, StepEfficiency, device_from_dict

GRID = (np.round(np.arange(0.30, 1.001, 0.01), 2), np.arange(0, 121, 1.0))  # shares; us per layer


def steps_of(check: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, layers, measured seconds) of each step row of a roofline check's JSON."""
    from tts.benchmarks.allocator_timing import SHAPES
    from tts.metrics.step_cost import RooflineCost

    device = device_from_dict(check["device_profile"])
    flops, bytes_, layers, seconds = [], [], [], []
    for row in check["steps"]:
        cost = RooflineCost(SHAPES[row["model"]], device, 0.0, measured=False)
        if row["stage"] == "decode":
            work = cost.work([row["ctx"]] * row["batch"], [])
        else:
            work = cost.work([], [(row["ctx"], 0)] * row["batch"])
        flops.append(work[0])
        bytes_.append(work[1])
        layers.append(cost.shape.num_layers)
        seconds.append(row["measured_ms"] / 1e3)
    return np.array(flops), np.array(bytes_), np.array(layers), np.array(seconds)


def fit(check: dict) -> tuple[float, float, float, float, float]:
    """(compute, memory, layer_us, rms error, max error) of the best grid point; the errors
    are of log(price / measured), over the file's steps."""
    device = device_from_dict(check["device_profile"])
    flops, bytes_, layers, seconds = steps_of(check)
    shares, layer_us = GRID
    compute = flops[None, :] / (device.peak_tflops * 1e12 * shares[:, None])  # [share, step]
    memory = bytes_[None, :] / (device.bandwidth_gbs * 1e9 * shares[:, None])
    roof = np.maximum(compute[:, None, :], memory[None, :, :])  # [compute share, memory share, step]
    best = (math.inf, 0, 0, 0)
    for k, us in enumerate(layer_us):
        err = np.log((roof + layers * us * 1e-6) / seconds)
        rms = np.sqrt(np.mean(err**2, axis=-1))
        i, j = np.unravel_index(np.argmin(rms), rms.shape)
        if rms[i, j] < best[0] - 1e-12:
            best = (float(rms[i, j]), i, j, k)
    _, i, j, k = best
    err = np.log((roof[i, j] + layers * layer_us[k] * 1e-6) / seconds)
    return float(shares[i]), float(shares[j]), float(layer_us[k]), best[0], float(np.max(np.abs(err)))


def efficiency(check: dict, path: str) -> StepEfficiency:
    """The fitted efficiencies, their source naming `path` (the file in this repository)."""
    compute, memory, layer_us, rms, worst = fit(check)
    return StepEfficiency(compute, memory, layer_us,
                          f"fit to {path} ({check['host_line']}; plain-PyTorch bf16 steps of Qwen2.5-1.5B and 7B "
                          f"shapes, decode as a CUDA graph, no vLLM) by python -m tts.profiling.step_fit: "
                          f"{len(check['steps'])} steps, rms error {rms:.0%}, max {worst:.0%}")


def table(check: dict, eff: StepEfficiency) -> str:
    """Each step measured, and priced under both modes (kernels only), as a Markdown table."""
    device: DeviceProfile = device_from_dict(check["device_profile"])
    flops, bytes_, layers, seconds = steps_of(check)
    datasheet = np.maximum(flops / (device.peak_tflops * 1e12), bytes_ / (device.bandwidth_gbs * 1e9))
    measured = layers * eff.layer_us * 1e-6 + np.maximum(flops / (device.peak_tflops * 1e12 * eff.compute),
                                                         bytes_ / (device.bandwidth_gbs * 1e9 * eff.memory))
    return markdown_table(["model", "stage", "batch", "context / tokens", "measured (ms)", "datasheet / measured",
                           "measured price / measured"],
                          ([r["model"], r["stage"], r["batch"], r["ctx"], f"{t * 1e3:.3f}", f"{a / t:.2f}", f"{b / t:.2f}"]
                           for r, t, a, b in zip(check["steps"], seconds, datasheet, measured)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("check", type=Path, help="a roofline_check JSON (docs/gpu/roofline_check_<gpu>.json)")
    args = ap.parse_args(argv)
    check = json.loads(args.check.read_text())
    eff = efficiency(check, args.check.as_posix())
    print("efficiency:")
    print(f"  compute: {eff.compute:g}\n  memory: {eff.memory:g}\n  layer_us: {eff.layer_us:g}")
    print(f"  source: {json.dumps(eff.source)}\n")
    print(table(check, eff))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
