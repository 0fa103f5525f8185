"""Does hiding the host's work behind the next step cost what the replay says it costs?

    PYTHONPATH=. python3 docs/gpu/overlap_check.py --out DIR     # about a minute on an H200

The trace replay prices a generator step at its model time plus the host's work per step
(`replay.overlap=false`: tts's Python, then vLLM's, while the card waits), and at the larger
of the two with `replay.overlap=true` (vLLM's asynchronous scheduling: step n+1 is launched
before the host has handled step n's outputs; `tts.replay.backends`). This check times both
on a real card, with torch alone (no vLLM):

- The model step is one decode step of Qwen2.5-1.5B's or 7B's shape (the paper's
  generators) with random bf16 weights, run as one CUDA graph as vLLM runs decode
  (`roofline_check.Model`). Its input is the embedding of the token the step before it
  sampled, on the card, so consecutive steps depend on each other as they do in vLLM.
- The host's work is a busy wait of `h` ms per step, from 0 to past the model step: the
  values tts's host work per generator step takes at n=512 on CPU runs (docs/results.md)
  lie inside the range.
- **Serial** (overlap off, as tts runs today): launch step n, copy its tokens to the
  host, wait for them, then the host works for `h` ms, then step n+1.
- **Overlapped** (a queue of two batches, as vLLM's `step_with_batch_queue`): step n+1 is
  launched before the host waits for step n's tokens and works on them.

For each model, batch and `h` it reports the wall per step against the replay's price
(model + h serial, max(model, h) overlapped, the model time taken back to back), and the
card's busy share (model time / wall). What the price leaves out (the launch, the copy and
the wait) is the difference; the replay's `replay.launch_ms` stands for it.

Writes `overlap_check.json` and `overlap_check.md` to --out and prints the table.
`--dry` runs a tiny shape on the CPU, without graphs, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline_check import SHAPES, Model, card_line, timed, write_result  # noqa: E402 - beside this file

from tts.memory.roofline import ModelShape  # noqa: E402

CASES = (("qwen2.5-1.5b", 256, 512), ("qwen2.5-1.5b", 512, 2048), ("qwen2.5-7b", 256, 512))
HOST_MS = (0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0)
STEPS, WARMUP = 60, 5


def busy(ms: float) -> None:
    """Hold the host (and Python's lock) for `ms`, as the engine's own Python does."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class Step:
    """One decode step whose input is the embedding of the previous step's tokens."""

    def __init__(self, model: Model, batch: int, ctx: int, device: str, graph: bool) -> None:
        s = model.s
        dt = torch.bfloat16
        self.emb = torch.randn(s.vocab_size, s.hidden_size, device=device, dtype=dt) * 0.02
        self.tok = torch.zeros(batch, dtype=torch.long, device=device)
        self.kc = torch.zeros(s.num_layers, batch, s.num_kv_heads, ctx + 1, s.head_dim, device=device, dtype=dt)
        self.vc = torch.zeros_like(self.kc)
        self.model, self.ctx = model, ctx
        self.graph = None
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._body()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._body()

    def _body(self) -> None:
        self.tok.copy_(self.model.decode(self.emb[self.tok], self.kc, self.vc, self.ctx) % self.emb.shape[0])

    def launch(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()


def per_step(step: Step, host_ms: float, overlap: bool, cuda: bool) -> float:
    """Wall seconds per step of STEPS steps (after WARMUP), serial or with a queue of two."""
    pin = cuda
    bufs = [torch.empty_like(step.tok, device="cpu", pin_memory=pin) for _ in range(2)]
    events = [torch.cuda.Event() if cuda else None for _ in range(2)]

    def launch(i: int) -> None:
        step.launch()
        bufs[i % 2].copy_(step.tok, non_blocking=cuda)
        if cuda:
            events[i % 2].record()

    def wait(i: int) -> None:
        if cuda:
            events[i % 2].synchronize()

    total = STEPS + WARMUP
    if overlap:
        launch(0)
    for i in range(total):
        if i == WARMUP:
            t0 = time.perf_counter()
        if overlap:
            if i + 1 < total:
                launch(i + 1)  # step i+1 goes to the card before step i's outputs are handled
        else:
            launch(i)
        wait(i)
        busy(host_ms)  # the host handles step i's tokens
    return (time.perf_counter() - t0) / STEPS


def rows_for(name: str, shape: ModelShape, batch: int, ctx: int, device: str) -> list[dict]:
    cuda = device == "cuda"
    model = Model(shape, device)
    step = Step(model, batch, ctx, device, graph=cuda)
    model_s = timed(step.launch) if cuda else _cpu_timed(step.launch)
    rows = []
    for h in HOST_MS:
        for overlap in (False, True):
            wall = per_step(step, h, overlap, cuda)
            price = max(model_s, h / 1e3) if overlap else model_s + h / 1e3
            rows.append(dict(model=name, batch=batch, ctx=ctx, host_ms=h, overlap=overlap,
                             model_ms=model_s * 1e3, wall_ms=wall * 1e3, price_ms=price * 1e3,
                             wall_over_price=wall / price, busy_share=model_s / wall,
                             priced_busy_share=model_s / price))
            print(json.dumps(rows[-1]), flush=True)
    del step, model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def _cpu_timed(fn) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    return (time.perf_counter() - t0) / 5


def markdown(result: dict) -> str:
    lines = [f"host: {result['host_line']}", "",
             "| model | batch | context | host work (ms) | model step (ms) | serial: wall (ms) | serial: price "
             "| serial: busy share | overlapped: wall (ms) | overlapped: price | overlapped: busy share |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = result["rows"]
    for serial, over in zip(rows[0::2], rows[1::2]):
        lines.append(f"| {serial['model']} | {serial['batch']} | {serial['ctx']} | {serial['host_ms']:g} | "
                     f"{serial['model_ms']:.2f} | {serial['wall_ms']:.2f} | {serial['price_ms']:.2f} | "
                     f"{serial['busy_share']:.2f} | {over['wall_ms']:.2f} | {over['price_ms']:.2f} | "
                     f"{over['busy_share']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry", action="store_true", help="a tiny shape on the CPU: checks the script, times nothing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    global STEPS, WARMUP, HOST_MS
    if args.dry:
        cases = [("tiny", ModelShape(2, 64, 4, 2, 16, 128, 1000, 2, 1), 4, 16)]
        STEPS, WARMUP, HOST_MS = 3, 1, (0.0, 1.0)
        device, host_line = "cpu", f"dry run on the CPU ({platform.processor() or platform.machine()})"
    elif not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine (or give --dry)", file=sys.stderr)
        return 2
    else:
        cases = [(name, SHAPES[name], b, c) for name, b, c in CASES]
        device, host_line = "cuda", card_line()
    t0 = time.time()
    rows = [r for name, shape, b, c in cases for r in rows_for(name, shape, b, c, device)]
    result = dict(host_line=host_line, steps=STEPS, warmup=WARMUP, rows=rows, seconds=time.time() - t0)
    write_result(args.out, "overlap_check", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
