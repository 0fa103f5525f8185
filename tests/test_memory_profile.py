"""`tts profile-memory` library side: the static sweep and the printed report."""

import io
import json
from types import SimpleNamespace

from rich.console import Console

import tts.memory.planner as planner
from tts.memory.allocator import Workload, evaluate_allocation, search_allocation
from tts.memory.device import load_device
from tts.memory.profile import FRACTIONS, profile_memory, static_sweep
from tts.memory.roofline import ModelShape

SMOL = ModelShape(30, 576, 9, 3, 64, 1536, 49152, 2, 134_515_008)
H100 = load_device("h100")


def test_evaluate_allocation_matches_search_at_its_choice():
    workload = Workload(num_requests=64, verifier_seq_len=512, decode_len=256)
    best = search_allocation(SMOL, SMOL, H100, workload, 10**9)
    assert evaluate_allocation(SMOL, SMOL, H100, workload, best.b_pre, best.b_dec) == best


def test_static_sweep_literal_caps():
    workload = Workload(num_requests=8, verifier_seq_len=100, decode_len=100)  # 2_304_000 B each
    rows = static_sweep(SMOL, SMOL, H100, workload, 10_000_000, fractions=(0.1, 0.5, 0.75))
    assert rows[0] == (0.1, None)  # 1 MB for the generator holds no request
    assert (rows[1][1].b_pre, rows[1][1].b_dec) == (2, 2)
    assert (rows[2][1].b_pre, rows[2][1].b_dec) == (1, 3)
    best = search_allocation(SMOL, SMOL, H100, workload, 10_000_000)
    assert all(best.t_total <= a.t_total for _, a in rows if a is not None)


def test_profile_memory_prints_tables_without_models(monkeypatch):
    monkeypatch.setattr(planner, "model_shape", lambda model: SMOL)
    cfg = SimpleNamespace(
        device=H100.to_dict(),
        generator=SimpleNamespace(model="g", step_max_tokens=96, max_total_tokens=768),
        verifier=SimpleNamespace(model="v"),
        memory=SimpleNamespace(kv_cache_gib=1.0, block_size=32),
        search=SimpleNamespace(n=8),
        bench=SimpleNamespace(concurrency=2),
    )
    out = io.StringIO()
    result = profile_memory(cfg, calibrate=False, console=Console(file=out, width=200))
    text = out.getvalue()
    assert "KV split sweep: N=16" in text and "roofline search" in text and "23040" in text
    assert result["breakdown"]["generator"]["kv_bytes_per_token"] == 23040
    assert [r["generator_fraction"] for r in result["sweep"]] == list(FRACTIONS)
    assert result["roofline"]["b_dec"] == 16
    json.dumps(result)  # JSON-ready, as profile.json
