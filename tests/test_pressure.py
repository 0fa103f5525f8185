"""The memory-pressure regime (issue: the paper's memory-constrained regime): a KV budget
stated as a share of the search's working set, block-pool counts on every backend, the
paper's vLLM baseline as a variant, the pressure sweep and its report."""

import json
from pathlib import Path

import pytest

from tts.backends.prefix_cache import CacheCounter, PrefixCache


def _bench(results: Path, name: str, extra: list[str]) -> Path:
    from tts.config.compose import compose
    from tts.runner import run_bench

    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", f"bench.results_dir={results}",
                             f"bench.run_name={name}", *extra])
    return Path(run_bench(cfg))


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_prefix_cache_counts_thrash_as_blocks_held_before():
    cache = PrefixCache(block=2, capacity=4)
    a, b = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    assert cache.admit(a) == 0  # 3 new blocks: a miss, nothing held before
    counter = CacheCounter(cache)
    assert cache.admit(b) == 0  # 3 more: a's last two are evicted (a sequence's tail goes first, as in vLLM)
    assert cache.admit(a) == 2  # a's first block is still cached; its other two are computed again
    c = counter.counts()
    assert c["lookups"] == 2 and c["misses"] == 2 and c["hits"] == 1
    assert c["thrash"] == 1 and c["thrash_blocks"] == 2 and c["thrash_tokens"] == 4
    assert c["evictions"] == 4  # a's two for b, then b's last two for a's
    assert cache.admit(a) == 6 and counter.counts()["hits"] == 4  # now it is all cached
    cache.clear()
    assert cache.admit(a) == 0 and counter.counts()["thrash"] == 1  # a reset forgets what was seen
    cache.note("preemptions")
    assert counter.counts()["preemptions"] == 1


def test_fake_engines_get_their_kv_budget_as_cache_blocks():
    from tts.backends.factory import Backends, EngineSpec
    from tts.backends.fake import BLOCK, KV_BYTES_PER_TOKEN
    from tts.config.compose import compose, validate

    cfg = validate(compose("config", ["generator=fake", "verifier=fake"]))
    gen, ver = Backends(cfg).get(EngineSpec(40 * BLOCK * KV_BYTES_PER_TOKEN, 8), EngineSpec(7 * BLOCK * KV_BYTES_PER_TOKEN, 8))
    assert gen.prefix_cache.capacity == 40 and ver.prefix_cache.capacity == 7


def test_working_set_fraction_sets_the_budget_and_is_validated():
    from tts.config.compose import ConfigError, compose, validate
    from tts.assembly.memory_split import working_set_bytes
    from tts.kv_budget import kv_budget
    from tts.backends.fake import KV_BYTES_PER_TOKEN

    node = compose("config", ["generator=fake", "verifier=fake", "search.n=16", "bench.concurrency=2",
                              "memory.working_set_fraction=0.25"])
    cfg = validate(node)
    tokens = 16 * 2 * (160 + cfg.generator.max_total_tokens)
    assert working_set_bytes(cfg) == tokens * 2 * KV_BYTES_PER_TOKEN  # both models' KV
    budget = kv_budget(node)
    assert budget.memory.kv_cache_gib == pytest.approx(0.25 * working_set_bytes(cfg) / 2**30, rel=1e-4)
    unset = compose("config", ["generator=fake", "verifier=fake"])
    assert kv_budget(unset) is unset
    with pytest.raises(ConfigError, match="memory.working_set_fraction"):
        compose("config", ["memory.working_set_fraction=0"])


def test_paper_baseline_thrashes_more_than_prefix_aware_scheduling(tmp_path):
    """Two fake engines share one budget (a static split of a small share of the working
    set), as the paper's vLLM baseline runs them; in random order the generator recomputes
    blocks it had evicted, siblings back to back (P, and PM: the fake has no model shapes,
    so M keeps the static split there) recompute fewer."""
    run = _bench(tmp_path, "pressure", [
        "search.n=16", "search.beam_width=4", "dataset.first_k=2", "memory.working_set_fraction=0.1",
        "memory.generator_max_num_seqs=2", "bench.compare=[paper_baseline,P,PM]", "optim.eos_at_depth_limit=false"])
    s = _summary(run)["variants"]
    base = s["paper_baseline"]
    assert base["gen_thrash_blocks"] > 0 and base["gen_thrash_share"] > 0
    assert base["gen_thrash_blocks"] > 1.3 * s["P"]["gen_thrash_blocks"]  # measured: 3318 against 1849
    assert base["gen_thrash_blocks"] > 1.3 * s["PM"]["gen_thrash_blocks"]
    assert "verifier KV blocks recomputed after eviction (thrash)" in (run / "summary.md").read_text()


def test_a_config_declares_its_sweep(tmp_path):
    """`hydra.sweeper.params` in a config is the sweep `-m` runs; the command line's own
    values for a key replace the config's."""
    from tts.cli_support import compose_jobs

    jobs = compose_jobs("pressure", ["generator=fake", "verifier=fake"], multirun=True, resume=False)
    cells = {(j.cfg.search.n, j.cfg.memory.working_set_fraction) for j in jobs}
    assert len(cells) == len(jobs) > 1
    jobs = compose_jobs("pressure", ["generator=fake", "verifier=fake", "memory.working_set_fraction=0.5"],
                        multirun=True, resume=False)
    assert {j.cfg.memory.working_set_fraction for j in jobs} == {0.5}


def test_report_draws_the_pressure_sweep(tmp_path):
    from tts.report.build import write_report

    results = tmp_path / "results"
    for fraction in (0.1, 1.0):
        _bench(results, f"sweep/f{fraction}", [
            "search.n=8", "search.beam_width=2", "dataset.first_k=2", f"memory.working_set_fraction={fraction}",
            "memory.generator_max_num_seqs=2", "bench.compare=[paper_baseline,P]"])
    report = write_report([str(results / "sweep")], out=tmp_path / "report")
    text = report.read_text()
    assert "## Memory pressure" in text and "gen thrash / prefill" in text
    assert (tmp_path / "report" / "pressure.png").exists()
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    gains = [r for r in data["pressure"] if r["variant"] == "P"]
    assert sorted(r["fraction"] for r in gains) == [0.1, 1.0]
    assert all(r["precise_goodput"] > 0 and r["pairs"] == 2 for r in gains)


def test_the_cli_runs_the_sweep_a_config_declares():
    """In a fresh process (the config store registered by the sweep's own compose), `-m` on
    `pressure_short` prints one config per cell of its declared grid."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "cli.main", "bench", "--config-name=pressure_short", "-m", "--cfg",
                           "generator=fake", "verifier=fake"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("working_set_fraction: 0.16") == 1 and done.stdout.count("working_set_fraction: 1.0") == 1
