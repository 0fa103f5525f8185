"""The position-keyed sampler's arithmetic on a GPU (`tts.backends.position_sampling`), on a
CUDA machine without vLLM: what its docstring claims, and CPU tests cannot show.

    PYTHONPATH=. python3 docs/gpu/sampler_check.py --out DIR   # about 10 s on an H100

1. **A row's token does not depend on the batch**: each of 256 rows of random float32
   logits over Qwen2.5's vocabulary (151,936) is sampled alone, then inside batches of 2 to
   256 rows in two orders; the tokens and the rows' block sums must be bit-identical.
   Half the rows sample with top-p 0.9 (the nucleus path), half with top-p 1.
2. **The GPU draws the CPU's token**: the same rows sampled on the CPU; a token may differ
   only where float32 rounding moves the draw across a token's CDF boundary (rare).
3. **Nothing syncs**: one decode step's sampling as `PositionSampler._sample` runs it (the
   uniforms hashed on the host into a pinned buffer, one non-blocking copy, `sample_rows`
   with the nucleus rows given, the winner written into the logits) under
   `torch.cuda.set_sync_debug_mode("error")`.
4. **Its cost**: that step's sampling for 1 to 256 rows, every row with top-p 1 or every
   row with top-p 0.9, CUDA-event median, beside exponential-noise sampling (no top-p)
   and a decode step of the 1.5B (2.4 to 4.5 ms, `roofline_check.py`).

Writes `sampler_check.json` and `sampler_check.md` to --out and prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from tts.backends import position_sampling as ps
from tts.backends.position_sampling import position_uniforms, sample_rows

VOCAB, ROWS = 151_936, 256
BATCHES = (1, 2, 3, 8, 33, 64, 128, 256)


def inputs(device: str):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(ROWS, VOCAB, generator=g) * 4.0).to(device)
    temps = torch.full((ROWS,), 0.8, device=device)
    top_ps = torch.tensor([0.9 if i % 2 else 1.0 for i in range(ROWS)], device=device)
    seeds = np.arange(ROWS, dtype=np.uint64) * np.uint64(7919) + np.uint64(13)
    uniforms = torch.tensor(position_uniforms(seeds, np.full(ROWS, 300, dtype=np.int64)), dtype=torch.float32,
                            device=device)
    return logits, temps, top_ps, uniforms


def block_sums(x: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """The rows' per-block probability mass, as `_search` computes it."""
    p = (x - x.amax(-1, keepdim=True)).div_(temps[:, None]).exp_()
    nb = -(-VOCAB // ps._BLOCK)
    p = torch.nn.functional.pad(p, (0, nb * ps._BLOCK - VOCAB))
    return p.view(x.shape[0], nb, ps._BLOCK).sum(-1)


def batch_independence() -> dict:
    logits, temps, top_ps, u = inputs("cuda")
    alone = torch.stack([sample_rows(logits[i:i + 1], temps[i:i + 1], top_ps[i:i + 1], u[i:i + 1]) for i in range(ROWS)])
    alone = alone.squeeze(-1)
    sums_alone = torch.cat([block_sums(logits[i:i + 1], temps[i:i + 1]) for i in range(ROWS)])
    out = {"token_mismatches": {}, "block_sum_mismatches": {}}
    for B in BATCHES:
        for order, idx in (("in order", torch.arange(B)), ("reversed", torch.arange(B - 1, -1, -1))):
            idx = idx.cuda()
            tok = sample_rows(logits[idx], temps[idx], top_ps[idx], u[idx])
            sums = block_sums(logits[idx], temps[idx])
            key = f"{B} {order}"
            out["token_mismatches"][key] = int((tok != alone[idx]).sum())
            out["block_sum_mismatches"][key] = int((sums != sums_alone[idx]).any(-1).sum())
    return out, alone.cpu()


def cpu_agreement(gpu_tokens: torch.Tensor) -> dict:
    logits, temps, top_ps, u = inputs("cpu")
    cpu = sample_rows(logits, temps, top_ps, u)
    return {"rows": ROWS, "tokens_differing_from_cpu": int((cpu != gpu_tokens).sum())}


def step(logits, index, temps, top_ps, nucleus, pinned, seeds, prompt_lens, lengths, winner):
    """One step of `PositionSampler._sample` (all rows owned, in order)."""
    pinned.numpy()[:] = position_uniforms(seeds, prompt_lens + lengths)
    uniforms = pinned.to("cuda", non_blocking=True)
    tokens = sample_rows(logits, temps, top_ps, uniforms, nucleus_rows=nucleus, inplace=True)
    logits.index_put_((index, tokens), winner)
    return logits


def step_setup(B: int, top_p: float | None = None):
    """`step`'s arguments for B rows (top-p alternating 0.9 and 1, or all `top_p`)."""
    logits, temps, top_ps, _ = inputs("cuda")
    top_ps = top_ps[:B] if top_p is None else torch.full((B,), top_p, device="cuda")
    nucleus = (top_ps < 1).nonzero().squeeze(-1)
    return dict(index=torch.arange(B, device="cuda"), temps=temps[:B], top_ps=top_ps, nucleus=nucleus,
                pinned=torch.empty(B, dtype=torch.float32, pin_memory=True),
                seeds=np.arange(B, dtype=np.uint64), prompt_lens=np.full(B, 200, dtype=np.int64),
                lengths=np.arange(B, dtype=np.int64), winner=torch.tensor(1e9, device="cuda")), logits[:B].clone()


def no_sync() -> str:
    args, logits = step_setup(64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(logits, **args)
        return "no synchronising call"
    except RuntimeError as e:
        return f"SYNC: {e}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def median_ms(fn, prepare) -> float:
    times = []
    for k in range(25):
        prepare()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if k >= 5:
            times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def gumbel(logits, temps):
    """The usual GPU sampling of softmax(logits / T), for scale: probs over exponential noise."""
    probs = torch.softmax(logits / temps[:, None], dim=-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


def cost() -> dict:
    """Milliseconds of one step's sampling by rows: top-p 1 for every row, 0.9 for every row,
    and the exponential-noise sampling (no top-p) for scale."""
    out: dict = {}
    for B in (1, 8, 64, 256):
        row = {}
        for name, top_p in (("top-p 1", 1.0), ("top-p 0.9", 0.9)):
            args, logits = step_setup(B, top_p)
            scratch = logits.clone()
            row[name] = median_ms(lambda: step(scratch, **args), lambda: scratch.copy_(logits))
        temps = args["temps"]
        row["exponential noise"] = median_ms(lambda: gumbel(logits, temps), lambda: None)
        out[B] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"host_line": f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"}
    result["batch_independence"], gpu_tokens = batch_independence()
    result["cpu_agreement"] = cpu_agreement(gpu_tokens)
    result["no_sync"] = no_sync()
    result["sampling_ms_by_rows"] = cost()
    (args.out / "sampler_check.json").write_text(json.dumps(result, indent=1))
    bi = result["batch_independence"]
    lines = [f"host: {result['host_line']}", "", "| rows in the batch | order | tokens unlike alone | rows with other block sums |",
             "|---|---|---|---|"]
    lines += [f"| {k.split()[0]} | {k.split(' ', 1)[1]} | {v} | {bi['block_sum_mismatches'][k]} |"
              for k, v in bi["token_mismatches"].items()]
    costs = result["sampling_ms_by_rows"]
    names = list(next(iter(costs.values())))
    lines += ["", f"GPU against CPU: {result['cpu_agreement']['tokens_differing_from_cpu']} of {ROWS} tokens differ",
              f"sync check: {result['no_sync']}", "", "| rows | " + " | ".join(f"{n} (ms)" for n in names) + " |",
              "|---|" + "---|" * len(names)]
    lines += [f"| {b} | " + " | ".join(f"{t[n]:.3f}" for n in names) + " |" for b, t in costs.items()]
    text = "\n".join(lines) + "\n"
    (args.out / "sampler_check.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
