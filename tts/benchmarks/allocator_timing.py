"""Timing of the allocation search: ``python -m tts.benchmarks.allocator_timing``.

A benchmark, not a test: it prints the mean and tail time of ``search_allocation`` over
random but realistic instances (N up to 512, KV budgets of 1-60 GB, real model shapes
and the shipped device profiles).
"""

from __future__ import annotations

import argparse
import random
import time

from tts.memory.allocator import Workload, search_allocation
from tts.memory.device import available_devices, load_device
from tts.memory.roofline import ModelShape

# Published config.json values (num_params estimated from the shape).
SHAPES: dict[str, ModelShape] = {
    "smollm2-135m": ModelShape(30, 576, 9, 3, 64, 1536, 49152, 2, 134_515_008),
    "qwen2.5-1.5b": ModelShape(28, 1536, 12, 2, 128, 8960, 151936, 2, 1_543_714_304),
    "qwen2.5-7b": ModelShape(28, 3584, 28, 4, 128, 18944, 152064, 2, 7_615_616_512),
    "mistral-7b": ModelShape(32, 4096, 32, 8, 128, 14336, 32000, 2, 7_241_732_096),
}


def random_instance(rng: random.Random) -> tuple[ModelShape, ModelShape, Workload, int]:
    """A random (generator, verifier, workload, KV budget in bytes)."""
    gen, ver = rng.choice(list(SHAPES.values())), rng.choice(list(SHAPES.values()))
    workload = Workload(
        num_requests=rng.randint(1, 512),
        verifier_seq_len=rng.randint(128, 4096),
        decode_len=rng.randint(16, 2048),
    )
    return gen, ver, workload, int(rng.uniform(1, 60) * 1e9)


def run(instances: int = 2000, seed: int = 0, offload: bool = False) -> list[float]:
    """Seconds per ``search_allocation`` call over ``instances`` random instances."""
    rng = random.Random(seed)
    devices = [load_device(name) for name in available_devices()]
    times = []
    for _ in range(instances):
        gen, ver, workload, budget = random_instance(rng)
        device = rng.choice(devices)
        overhead = rng.uniform(0.0, 2.0) if offload else None
        t0 = time.perf_counter()
        search_allocation(gen, ver, device, workload, budget, offload_overhead_s=overhead)
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    """CLI: ``[--instances K] [--seed S]``; prints timings in microseconds."""
    parser = argparse.ArgumentParser(prog="python -m tts.benchmarks.allocator_timing",
                                     description="time the allocation search on random instances")
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for offload in (False, True):
        times = sorted(run(args.instances, args.seed, offload))
        mean_us = sum(times) / len(times) * 1e6
        p99_us = times[int(0.99 * (len(times) - 1))] * 1e6
        label = "split+offload" if offload else "split"
        print(f"search_allocation [{label}]: {len(times)} instances, N<=512: "
              f"mean {mean_us:.1f} us, p99 {p99_us:.1f} us, max {times[-1] * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
