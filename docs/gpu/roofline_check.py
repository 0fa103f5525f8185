"""What a CUDA machine without vLLM can check of tts's GPU route, and of the roofline the
trace replay prices a GPU's engine steps with (`tts.metrics.step_cost.RooflineCost`).

    PYTHONPATH=. python3 docs/gpu/roofline_check.py --out DIR   # about 30 s on an H100

1. **Host**: the functions a vLLM run on this card calls before its engines start:
   `has_cuda`, `gpu_name`, `gpu_by_name` (which datasheet profile the card gets, if any),
   `gpu_profile` (a run that names no device gets its card's profile, not the CPU's) and
   `resolve_dtype("auto")` (bf16 on a GPU).
2. **Device**: a bf16 matmul's TFLOP/s and a device copy's GB/s (bytes read and written),
   against the profile's datasheet numbers.
3. **Steps**: one engine step of Qwen2.5-1.5B's and Qwen2.5-7B's shapes (the paper's
   generators and PRMs) in plain torch: random bf16 weights, RMS norms, SDPA attention
   over a KV cache, the gated MLP and the logits; rotary embeddings and sampling are left
   out. A decode step (B sequences, each attending to its context) runs as one CUDA graph,
   as vLLM runs decode; so does a prefill chunk (one sequence, nothing cached), and each
   also runs eagerly, kernel by kernel. Each is timed against the roofline with no launch
   overhead. vLLM's own kernels (paged attention, fused norms) and its
   per-step scheduler and sampler are not here: the replay's `replay.launch_ms` stands for
   the latter, and this check does not measure it.

Writes `roofline_check.json` and `roofline_check.md` to --out and prints the tables. Kept
as `docs/gpu/roofline_check_<gpu>.json`, they give the card's profile its measured step
efficiencies: `python -m tts.profiling.step_fit docs/gpu/roofline_check_<gpu>.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tts.memory.device import load_device
from tts.memory.roofline import ModelShape
from tts.metrics.step_cost import RooflineCost

SHAPES = {  # as in tts.benchmarks.allocator_timing: the models' config.json numbers
    "qwen2.5-1.5b": ModelShape(28, 1536, 12, 2, 128, 8960, 151936, 2, 1_543_714_304),
    "qwen2.5-7b": ModelShape(28, 3584, 28, 4, 128, 18944, 152064, 2, 7_615_616_512),
}
DECODE_BATCHES = (1, 8, 32, 64, 128, 256, 512)  # 512: added for the H200 run (the H100 run stopped at 256)
DECODE_CTX = (512, 2048)
PREFILL_TOKENS = (512, 2048, 8192)


def host_checks() -> dict:
    """The GPU route's host functions on this card; each result or its error."""
    out: dict = {}

    def check(name, fn):
        try:
            out[name] = fn()
        except Exception as e:  # noqa: BLE001 - a check's failure is its result
            out[name] = f"ERROR {type(e).__name__}: {e}"

    from tts.backends.vllm.engine import gpu_free_bytes, gpu_name, has_cuda, resolve_dtype
    from tts.memory.gpus import gpu_by_name
    from tts.profiling.gpu import gpu_profile

    check("has_cuda", has_cuda)
    check("gpu_name", gpu_name)
    check("gpu_by_name", lambda: getattr(gpu_by_name(gpu_name()), "name", None))
    def chosen():
        profile, note = gpu_profile(load_device("cpu"))
        return f"{profile.name}: {note}"

    check("gpu_profile(device=cpu)", chosen)
    check("resolve_dtype(auto, bf16 model)", lambda: resolve_dtype("auto", {"torch_dtype": "bfloat16"}))
    check("resolve_dtype(auto, no dtype)", lambda: resolve_dtype("auto", {}))
    check("gpu_free_gb", lambda: round(gpu_free_bytes() / 1e9, 2))
    check("torch", lambda: torch.__version__)
    return out


def timed(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds of `fn` on the GPU (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def device_checks() -> dict:
    out = {}
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        out[f"matmul_{n}_tflops"] = 2 * n**3 / timed(lambda: a @ b) / 1e12
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    out["copy_1GiB_gbs"] = 2 * src.numel() / timed(lambda: dst.copy_(src)) / 1e9
    return out


class Model:
    """One transformer of `shape`'s dimensions with random bf16 weights."""

    def __init__(self, s: ModelShape, dev: str = "cuda") -> None:
        self.s = s
        dt = torch.bfloat16
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim

        def w(*size):
            return torch.randn(*size, device=dev, dtype=dt) * 0.02

        self.layers = [dict(qkv=w(s.hidden_size, q + 2 * kv), o=w(q, s.hidden_size),
                            gu=w(s.hidden_size, 2 * s.intermediate_size), d=w(s.intermediate_size, s.hidden_size),
                            n1=torch.ones(s.hidden_size, device=dev, dtype=dt),
                            n2=torch.ones(s.hidden_size, device=dev, dtype=dt))
                       for _ in range(s.num_layers)]
        self.lm = w(s.hidden_size, s.vocab_size)
        self.norm = torch.ones(s.hidden_size, device=dev, dtype=dt)

    def _mlp(self, layer, x):
        g, u = (F.rms_norm(x, (x.shape[-1],), layer["n2"]) @ layer["gu"]).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ layer["d"]

    def decode(self, x, kc, vc, pos: int):
        """x [B, h]; kc/vc [layers, B, kv heads, ctx + 1, head dim]; writes position `pos`."""
        s, B = self.s, x.shape[0]
        q_dim, kv_dim, group = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_heads // s.num_kv_heads
        for i, layer in enumerate(self.layers):
            qkv = F.rms_norm(x, (x.shape[-1],), layer["n1"]) @ layer["qkv"]
            q, k, v = qkv.split((q_dim, kv_dim, kv_dim), dim=-1)
            kc[i, :, :, pos] = k.view(B, s.num_kv_heads, s.head_dim)
            vc[i, :, :, pos] = v.view(B, s.num_kv_heads, s.head_dim)
            # decode with grouped KV heads: each KV head's `group` queries attend to all of it
            att = F.scaled_dot_product_attention(q.view(B, s.num_kv_heads, group, s.head_dim), kc[i], vc[i])
            x = x + att.reshape(B, q_dim) @ layer["o"]
            x = self._mlp(layer, x)
        return (F.rms_norm(x, (x.shape[-1],), self.norm) @ self.lm).argmax(-1)

    def prefill(self, x):
        """x [T, h]: one sequence's chunk with nothing cached; logits of its last token."""
        s, T = self.s, x.shape[0]
        q_dim, kv_dim, group = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_heads // s.num_kv_heads
        for layer in self.layers:
            qkv = F.rms_norm(x, (x.shape[-1],), layer["n1"]) @ layer["qkv"]
            q, k, v = qkv.split((q_dim, kv_dim, kv_dim), dim=-1)
            # [1, heads, T, head dim]: SDPA's flash kernel takes 4-D inputs (3-D falls back to
            # the math kernel, which writes the T x T scores)
            q = q.view(1, T, s.num_heads, s.head_dim).transpose(1, 2)
            k = k.view(1, T, s.num_kv_heads, s.head_dim).transpose(1, 2).repeat_interleave(group, 1)
            v = v.view(1, T, s.num_kv_heads, s.head_dim).transpose(1, 2).repeat_interleave(group, 1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + att.transpose(1, 2).reshape(T, q_dim) @ layer["o"]
            x = self._mlp(layer, x)
        return F.rms_norm(x[-1:], (x.shape[-1],), self.norm) @ self.lm


def graph_and_eager(fn) -> tuple[float, float]:
    """(seconds as one CUDA graph, seconds launched eagerly) of `fn`."""
    eager = timed(fn, repeats=5, warmup=2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    t = timed(graph.replay)
    del graph
    return t, eager


def decode_time(model: Model, B: int, ctx: int) -> tuple[float, float]:
    """(CUDA-graph seconds, eager seconds) of one decode step of B sequences at `ctx`."""
    s = model.s
    x = torch.randn(B, s.hidden_size, device="cuda", dtype=torch.bfloat16)
    kc = torch.zeros(s.num_layers, B, s.num_kv_heads, ctx + 1, s.head_dim, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    out = graph_and_eager(lambda: model.decode(x, kc, vc, ctx))
    del kc, vc
    torch.cuda.empty_cache()
    return out


def step_rows(device) -> list[dict]:
    rows = []
    for name, shape in SHAPES.items():
        model = Model(shape)
        roof = RooflineCost(shape, device, 0.0, measured=False)  # the datasheet roofline, no launch
        for ctx in DECODE_CTX:
            for B in DECODE_BATCHES:
                t, eager = decode_time(model, B, ctx)
                r = roof.step_s([ctx] * B, [])
                rows.append(dict(model=name, stage="decode", batch=B, ctx=ctx, measured_ms=t * 1e3,
                                 eager_ms=eager * 1e3, roofline_ms=r * 1e3, measured_over_roofline=t / r))
                print(json.dumps(rows[-1]), flush=True)
        for T in PREFILL_TOKENS:
            x = torch.randn(T, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
            t, eager = graph_and_eager(lambda: model.prefill(x))
            r = roof.step_s([], [(T, 0)])
            rows.append(dict(model=name, stage="prefill", batch=1, ctx=T, measured_ms=t * 1e3, eager_ms=eager * 1e3,
                             roofline_ms=r * 1e3, measured_over_roofline=t / r))
            print(json.dumps(rows[-1]), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def markdown(result: dict) -> str:
    lines = [f"host: {result['host_line']}", "", "| check | result |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["host"].items()]
    dev = result["device_profile"]
    lines += ["", f"| device ({dev['name']} profile: {dev['peak_tflops']} TFLOP/s, {dev['bandwidth_gbs']} GB/s) "
              "| measured | share of the profile |", "|---|---|---|"]
    for k, v in result["device"].items():
        peak = dev["bandwidth_gbs"] if k.endswith("gbs") else dev["peak_tflops"]
        lines.append(f"| {k} | {v:.0f} | {v / peak:.2f} |")
    lines += ["", "| model | stage | batch | context / tokens | measured (ms) | eager (ms) | roofline (ms) "
              "| measured / roofline |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['stage']} | {r['batch']} | {r['ctx']} | {r['measured_ms']:.3f} | "
              f"{r['eager_ms']:.3f} | {r['roofline_ms']:.3f} | {r['measured_over_roofline']:.2f} |"
              for r in result["steps"]]
    return "\n".join(lines) + "\n"


def card_line() -> str:
    """The card, torch and CUDA, and the host's processor: the line a check's table starts with."""
    props = torch.cuda.get_device_properties(0)
    return (f"{torch.cuda.get_device_name(0)} ({props.multi_processor_count} SMs, "
            f"{props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, {platform.processor() or platform.machine()}")


def write_result(out: Path, name: str, result: dict, text: str) -> None:
    """`name`.json and `name`.md in `out`, and the table printed."""
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(text)
    print(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    t0 = time.time()
    host = host_checks()
    try:  # the profile a run on this card takes; the h100's where that fails
        from tts.profiling.gpu import gpu_profile

        profile = gpu_profile(load_device("cpu"))[0]
    except Exception:  # noqa: BLE001 - the host checks above record the error
        profile = load_device("h100")
    result = dict(host_line=card_line(), host=host, device_profile=profile.to_dict())
    result["device"] = device_checks()
    print(json.dumps(result["device"]), flush=True)
    result["steps"] = step_rows(profile)
    result["seconds"] = time.time() - t0
    write_result(args.out, "roofline_check", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
