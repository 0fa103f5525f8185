"""How long does tts's own Python take per generator step on a GPU server's CPU?

    PYTHONPATH=. python3 docs/gpu/engine_host_check.py --out DIR      # a minute or two

docs/results.md measures the engine's own host work per generator step at n=512 on the
CPU hosts this project is built on (shared cores, a few ms a step); the replay prices a GPU
run with those times. A GPU server's CPU runs the same Python at its own speed. This check
runs the engine's search at n=512 on the fake backend (`tts.backends.fake`: no model, no
vLLM, no torch), on whatever machine it is started, and reports per generator step:

- the wall time, the fake generator's and verifier's own time (their token and score
  making, which stands in for the models), and the rest: the engine's own work (the
  schedule, the step rule on every token, the trees, the metrics), per step and per
  running request;
- the same run's Python garbage collections (count and time per generation).

It imports `tts` and its pure-Python dependencies (omegaconf, hydra, PyYAML), nothing
else. Run it on both machines and compare the engine's ms per step: the ratio is how much
faster (or slower) that host runs tts's Python. It is not a vLLM run: vLLM's own request
calls and output processing are not in it.

Writes `engine_host_check.json` and `.md` to --out and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path


def run(n: int, m: int, iterations: int, problems: int, speculative: bool) -> dict:
    from tts.backends.fake import FakeGenerator, FakeVerifier
    from tts.config.schema import SearchConfig
    from tts.engine.engine import Engine, EngineOptions, ProblemInput
    from tts.search import make_policy

    cfg = SearchConfig(n=n, beam_width=m, max_iterations=iterations)
    gen, ver = FakeGenerator(batch_cap=n), FakeVerifier()
    timed = {"gen_s": 0.0, "ver_s": 0.0, "steps": 0, "running": 0}
    step, score = gen._step, ver._score

    def gen_step():
        start = time.perf_counter()
        deltas, stats = step()
        timed["gen_s"] += time.perf_counter() - start
        timed["steps"] += 1
        timed["running"] += len(deltas)
        return deltas, stats

    def ver_score(requests):
        start = time.perf_counter()
        out = score(requests)
        timed["ver_s"] += time.perf_counter() - start
        return out

    gen._step, ver._score = gen_step, ver_score
    options = EngineOptions(speculative=speculative, ordering="prefix_aware" if speculative else "random")
    engine = Engine(gen, ver, lambda: make_policy(cfg, 64, 640), "sys", options)
    collections = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    began = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            c = collections[info["generation"]]
            c[0] += 1
            c[1] += time.perf_counter() - began[0]

    gc.collect()
    gc.callbacks.append(on_gc)
    start = time.perf_counter()
    try:
        for _ in engine.run([ProblemInput(f"p{i}", f"problem {i}") for i in range(problems)]):
            pass
    finally:
        gc.callbacks.remove(on_gc)
    wall = time.perf_counter() - start
    own = wall - timed["gen_s"] - timed["ver_s"]
    steps = max(timed["steps"], 1)
    return {"n": n, "beam_width": m, "iterations": iterations, "problems": problems, "speculative": speculative,
            "wall_s": wall, "generator_steps": timed["steps"], "running_per_step": timed["running"] / steps,
            "fake_models_ms_per_step": 1e3 * (timed["gen_s"] + timed["ver_s"]) / steps,
            "engine_ms_per_step": 1e3 * own / steps,
            "engine_us_per_running_request": 1e6 * own / max(timed["running"], 1),
            "gc": {str(g): {"count": c, "s": round(s, 4)} for g, (c, s) in collections.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tts.results.host import cpu_model

    host = {"cpu": cpu_model(), "cores": __import__("os").cpu_count(), "python": platform.python_version()}
    rows = []
    for speculative in (False, True):
        for _ in range(args.repeats):
            rows.append(run(args.n, 4, args.iterations, 1, speculative))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_host_check.json").write_text(json.dumps({"host": host, "runs": rows}, indent=1))
    lines = [f"Host: {host['cpu']}, {host['cores']} cores, Python {host['python']}; the fake backend, "
             f"n={args.n}, beam width 4, {args.iterations} iterations, one problem", "",
             "| speculation | generator steps | running a step | engine ms/step | engine us/request | fake models ms/step | full gc (count, s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'run-on' if r['speculative'] else 'none'} | {r['generator_steps']} | {r['running_per_step']:.0f} | "
                     f"{r['engine_ms_per_step']:.2f} | {r['engine_us_per_running_request']:.1f} | "
                     f"{r['fake_models_ms_per_step']:.2f} | {r['gc']['2']['count']}, {r['gc']['2']['s']:.3f} |")
    text = "\n".join(lines) + "\n"
    (args.out / "engine_host_check.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
