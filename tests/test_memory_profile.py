"""`tts profile-memory`: the modelled sweep, the workload caps, a fake-backend profile, and a
tiny real profile whose breakdown is checked against what vLLM itself logs at start."""

from __future__ import annotations

import io
import json
import logging
import math
import re

import pytest
from rich.console import Console

from tts.backends.vllm.engine import dtype_bytes
from tts.config.compose import compose
from tts.memory.allocator import Workload, evaluate_allocation, search_allocation
from tts.memory.device import load_device
from tts.profiling.verb import profile_memory, sweep_table
from tts.profiling.modelled import FRACTIONS, modelled_sweep, static_sweep
from tts.profiling.sweep import workload_overrides
from tts.memory.roofline import ModelShape
from tts.models.cache import is_present
from tts.report.plots import split_sweep

# The engines run in float32 on a CPU without native bf16 (`resolve_dtype`): KV bytes and
# weights scale with the element width, and so does the tiny budget below.
WIDTH = dtype_bytes("auto", {"torch_dtype": "bfloat16"})
needs_model = pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                                 reason="default model not pulled (tts models pull smollm2-135m-instruct)")
SMOL = ModelShape(30, 576, 9, 3, 64, 1536, 49152, 2, 134_515_008)
H100 = load_device("h100")
GIB = 2**30
PLOTS = ("memory_breakdown.png", "split_throughput.png", "kv_blocks_per_step.png",
         "cache_hit_rates.png", "thrash.png")
REPORTED = ("system_tokens_per_s", "generator_tokens_per_s", "verifier_tokens_per_s",
            "gen_thrash", "ver_thrash", "gen_hit_rate", "ver_hit_rate")


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


def test_modelled_sweep_is_json_ready():
    workload = Workload(num_requests=16, verifier_seq_len=400, decode_len=96, gen_context_len=300)
    out = modelled_sweep(SMOL, SMOL, H100, workload, GIB, FRACTIONS)
    assert [r["generator_fraction"] for r in out["rows"]] == list(FRACTIONS)
    assert out["shapes"]["generator"]["kv_bytes_per_token"] == 23040
    assert out["roofline"]["b_dec"] >= 1
    json.dumps(out)


def test_workload_caps_and_beam_width():
    cfg = compose("config", ["logger=none", "generator=fake", "verifier=fake", "search.n=32"])
    assert workload_overrides(cfg) == {"search.n": 16, "generator.step_max_tokens": 32,
                                       "generator.max_total_tokens": 128, "search.max_iterations": 6,
                                       "bench.concurrency": 2}
    small = compose("config", ["logger=none", "generator=fake", "search.n=2", "search.beam_width=2",
                               "generator.step_max_tokens=8", "generator.max_total_tokens=24",
                               "search.max_iterations=2", "bench.concurrency=2"])
    assert workload_overrides(small) == {}  # caps never raise a limit
    odd = compose("config", ["logger=none", "generator=fake", "search.n=12", "search.beam_width=3",
                             "profile.search_n=4"])
    assert workload_overrides(odd)["search.beam_width"] == 1  # 4 beams, width must divide them


@needs_model
def test_profile_kv_budget_is_in_generator_tokens():
    cfg = compose("config", ["logger=none", "profile.kv_budget_tokens=1000"])
    assert workload_overrides(cfg)["memory.kv_cache_gib"] == round(1000 * 2 * 30 * 3 * 64 * WIDTH / 2**30, 6)
    cfg = compose("config", ["logger=none", "profile.kv_budget_tokens=null"])
    assert "memory.kv_cache_gib" not in workload_overrides(cfg)


FAKE = ["logger=none", "generator=fake", "verifier=fake", "profile.num_problems=2",
        "profile.splits=[0.3,0.6]", "profile.tight_split=0.3", "profile.loose_split=0.6"]


@pytest.mark.parametrize("override, message", [
    ("profile.splits=[0.0,0.5]", "profile.splits"),
    ("profile.tight_split=1.0", "profile.tight_split"),
    ("profile.num_problems=0", "profile.num_problems"),
])
def test_invalid_profile_sections_are_refused(tmp_path, override, message):
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", override])
    with pytest.raises(ValueError, match=message):
        profile_memory(cfg, console=Console(file=io.StringIO()))


def test_fake_backend_profile_writes_the_folder(tmp_path):
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=fake"])
    out = io.StringIO()
    folder = profile_memory(cfg, console=Console(file=out, width=200))
    assert folder == tmp_path / "fake"
    profile = json.loads((folder / "profile.json").read_text())
    assert [r["generator_fraction"] for r in profile["sweep"]] == [0.3, 0.6]
    assert all(r["system_tokens_per_s"] > 0 and r["gen_tokens"] > 0 for r in profile["sweep"])
    assert profile["breakdown"] == {} and profile["modelled"] is None
    assert (folder / "config.yaml").exists() and (folder / "split_throughput.png").exists()
    assert set(profile["kv_blocks_per_step"]) == {"tight", "loose"}
    assert split_sweep(profile)[0] == "generator_fraction"  # `tts report` reads the sweep
    assert "KV split sweep" in out.getvalue()
    with pytest.raises(FileExistsError, match="already holds a run; choose another bench.run_name"):
        profile_memory(cfg, console=Console(file=io.StringIO()))


# --------------------------------------------------------------------- real vLLM, tiny

# memory.generator_fraction=0.1 cannot start the generator (6 MiB at bf16 < one 1064-token
# sequence): the breakdown falls back to 0.45, the first share that starts both engines.
TINY = ["logger=none", "search.n=2", "search.beam_width=2", "search.max_iterations=2",
        "generator.step_max_tokens=8", "generator.max_total_tokens=24", f"memory.kv_cache_gib={0.03 * WIDTH}",
        "memory.generator_fraction=0.1", "memory.generator_max_num_seqs=8",
        "memory.verifier_max_num_seqs=8", "profile.splits=[0.1,0.45,0.55]", "profile.num_problems=1",
        "profile.tight_split=0.45", "profile.loose_split=0.55", "bench.run_name=tiny",
        "profile.kv_budget_tokens=null", "profile.concurrency=null"]
KV_SIZE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens "
                     r"per request: ([\d.]+)x")
KV_SET = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
CHECKPOINT = re.compile(r"Checkpoint size: ([\d.]+) GiB")



class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tts.backends.vllm.internals import configure_vllm_logging

    configure_vllm_logging()  # vLLM's first engine would re-apply it and drop our handler
    handler = _Lines()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    out = io.StringIO()
    try:
        cfg = compose("config", TINY + [f"bench.results_dir={tmp_path_factory.mktemp('profile')}"])
        folder = profile_memory(cfg, console=Console(file=out, width=200))
    finally:
        vllm_logger.removeHandler(handler)
    return folder, json.loads((folder / "profile.json").read_text()), handler.lines, out.getvalue()


@pytest.mark.vllm
@needs_model
def test_breakdown_agrees_with_vllm_start_log(tiny):
    _, profile, lines, _ = tiny
    logged = {(int(n.replace(",", "")), int(m.replace(",", "")), float(c))
              for n, m, c in (KV_SIZE.search(line).groups() for line in lines if KV_SIZE.search(line))}
    kv_set = {float(m.group(1)) for line in lines if (m := KV_SET.search(line))}
    for role in ("generator", "verifier"):
        b = profile["breakdown"][role]
        n_tokens, max_len = b["kv_cache_size_tokens"], b["max_model_len"]
        assert (n_tokens, max_len, round(b["max_concurrency"], 2)) in logged
        per_request = math.ceil(max_len / b["block_size"])
        assert round(n_tokens / max_len * per_request) == b["kv_num_blocks"]
        assert round(b["kv_cache_bytes"] / GIB, 2) in kv_set
        assert b["kv_cache_bytes"] == b["kv_num_blocks"] * b["kv_bytes_per_block"] <= b["requested_kv_bytes"]
        assert b["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * WIDTH and b["block_size"] == 32
        assert b["weights_bytes"] > 0 and isinstance(b["measured_start_bytes"], int)
    checkpoint = [float(m.group(1)) for line in lines if (m := CHECKPOINT.search(line))]
    for gib in checkpoint:  # the bf16 checkpoint holds exactly the weights, at bf16 width
        weights = profile["breakdown"]["generator"]["weights_bytes"] * 2 / WIDTH
        assert weights / GIB == pytest.approx(gib, abs=0.01)


@pytest.mark.vllm
@needs_model
def test_tiny_profile_writes_sweep_rows_and_plots(tiny):
    folder, profile, _, printed = tiny
    rows = profile["sweep"]
    assert [r["generator_fraction"] for r in rows] == [0.45, 0.55]
    assert [s["generator_fraction"] for s in profile["skipped"]] == [0.1]
    assert "generator: kv_cache_bytes" in profile["skipped"][0]["reason"]
    for r in rows:
        assert all(r[k] is not None for k in REPORTED)
        assert r["system_tokens_per_s"] > 0 and r["generator_tokens_per_s"] > r["system_tokens_per_s"]
        assert 0.0 <= r["gen_hit_rate"] <= 1.0 and 0.0 <= r["ver_hit_rate"] <= 1.0
        assert r["gen_thrash"] >= 0 and r["gen_block_misses"] >= 1 and r["ver_lookups"] >= 1
        assert 0 < r["gen_kv_blocks_peak"] < r["gen_kv_blocks"]
    assert profile["breakdown_generator_fraction"] == 0.45
    first = profile["breakdown"]["generator"]["kv_num_blocks"]
    assert rows[0]["gen_kv_blocks"] == first == rows[1]["ver_kv_blocks"]  # 0.45 of the budget each
    for name in ("tight", "loose"):
        trace = profile["kv_blocks_per_step"][name]
        for role in ("generator", "verifier"):
            assert trace[role] and max(trace[role]) <= trace[f"{role}_usable_blocks"]
    for plot in PLOTS:
        assert (folder / plot).stat().st_size > 0
    assert (folder / "config.yaml").exists()
    assert split_sweep(profile)[0] == "generator_fraction"
    assert "memory per model" in printed and "KV split sweep" in printed


@needs_model
def test_a_budget_no_share_can_start_is_refused_before_any_engine(tmp_path):
    cfg = compose("config", ["logger=none", "memory.kv_cache_gib=0.02", "profile.kv_budget_tokens=null",
                             "profile.splits=[0.5]",
                             "profile.tight_split=0.5", "profile.loose_split=0.5",
                             f"bench.results_dir={tmp_path}"])
    with pytest.raises(ValueError, match="no generator share can start both engines"):
        profile_memory(cfg, console=Console(file=io.StringIO()))
    assert not any(tmp_path.iterdir())  # refused before the results folder was made


def test_sweep_table_formats_missing_values():
    row = {"generator_fraction": 0.5, "gen_kv_bytes": 2**20, "ver_kv_bytes": 2**20,
           "system_tokens_per_s": 1.0, "generator_tokens_per_s": None, "verifier_tokens_per_s": 2.0,
           "gen_kv_blocks_peak": 0.25}
    out = io.StringIO()
    Console(file=out, width=200).print(sweep_table([row]))
    assert "0.50" in out.getvalue() and "0.25/-" in out.getvalue()
