"""Every search algorithm on real vLLM (CPU) with the default model, tiny limits.

Invariants checked on the real outputs: each beam's text is its steps' concatenation,
token counts match the tokenizer, scores lie in [0, 1], selections respect the policy,
every record is complete. Also the benchmark path (`run_bench`) end to end.

The models run in the dtype `auto` gives this host (bf16 where the CPU has it, else
float32), except where a test asserts exact equality of trees or records: those pin
float32 (`EXACT`), the only dtype in which a row's logits do not depend on the batch or
the prefix cache. `test_bf16_search_is_a_valid_search` runs bf16 explicitly.
"""

import json
import shutil
import statistics

import pytest

from tts.backends.factory import Backends, static_split
from tts.config.compose import compose, validate
from tts.engine.engine import ProblemInput
from tts.models.cache import is_present
from tts.results.store import RunStore
from tts.assembly.build import build_engine
from tts.runner import run_bench

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                                 reason="default model not pulled (tts models pull smollm2-135m-instruct)")]

TINY = ["logger=none", "bench.warmup=0", "search.n=4", "search.beam_width=2", "search.max_iterations=2",
        "generator.step_max_tokens=12", "generator.max_total_tokens=36", "memory.kv_cache_gib=0.25",
        "memory.generator_max_num_seqs=8", "memory.verifier_max_num_seqs=8"]
EXACT = ["generator.dtype=float32", "verifier.dtype=float32"]
# speculation needs a step that ends at its boundary while others still run: a problem of
# several steps, in steps long enough to end at one
WORDY = "A train goes 60 km in 1.5 hours, then 40 km in 0.5 hours. Find its average speed, step by step."
WORDY_STEPS = ["generator.step_max_tokens=24", "generator.max_total_tokens=72"]
ALGOS = ["beam", "dvts", "best_of_n", "self_consistency", "dynamic_branching", "varying_granularity"]


@pytest.fixture(scope="module")
def backends():
    cfg = validate(compose("config", TINY))
    b = Backends(cfg)
    yield b
    b.close()


def engine_for(backends, *overrides):
    cfg = validate(compose("config", TINY + list(overrides)))
    backends.cfg = cfg
    return cfg, build_engine(cfg, cfg.optim, backends)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_on_real_vllm(backends, algo):
    cfg, engine = engine_for(backends, f"search={algo}", "search.n=4", "search.beam_width=2",
                             "search.max_iterations=2", "search.early_step_max_tokens=6")
    outs = list(engine.run([ProblemInput("q1", "What is 2 + 3?")]))
    assert len(outs) == 1
    out = outs[0]
    tok = backends._gen[1]
    assert len(out.candidates) == cfg.search.n
    for beam in out.candidates:
        assert beam.text == "".join(s.text for s in beam.steps)
        assert beam.num_tokens <= cfg.generator.max_total_tokens
        for step in beam.steps:
            assert tok.decode(step.token_ids) == step.text
            assert len(step.token_ids) <= max(cfg.generator.step_max_tokens, cfg.generator.max_total_tokens)
        if out.policy.uses_verifier and algo != "varying_granularity":
            assert all(s is not None and 0.0 <= s <= 1.0 for s in beam.scores)
        if not out.policy.uses_verifier:
            assert all(s is None for s in beam.scores)
    m = out.metrics
    assert m.gen_tokens > 0 and m.generator_s > 0 and m.iterations >= 1
    assert m.gen_prompt_tokens > 0 and 0 <= m.gen_cached_tokens <= m.gen_prompt_tokens
    if out.policy.uses_verifier:
        assert m.verifier_s > 0 and m.scores_computed > 0


def test_beam_selection_respects_policy(backends):
    _, engine = engine_for(backends, "search=beam", "search.max_iterations=3", "optim.eos_at_depth_limit=false")
    seen = []
    policy = engine.policy
    orig = policy.select

    def spy(search, now):
        scored = [b for b in search.frontier if not b.is_finished_path]
        orig(search, now)
        seen.append((scored, list(search.frontier)))

    policy.select = spy
    list(engine.run([ProblemInput("q2", "Compute 7 * 6.")]))
    for scored, nxt in seen:
        if not nxt:
            continue
        keep = policy.cfg.n // policy.cfg.beam_width
        parents = {b.parent for b in nxt}
        assert len(parents) <= keep
        best = sorted(scored, key=policy.path_score, reverse=True)[:keep]
        cutoff = min(policy.path_score(b) for b in best)
        kept = [b for b in scored if b.uid in parents]
        assert all(policy.path_score(b) >= cutoff for b in kept)


@pytest.mark.parametrize("preset", ["PMS", "PMS_branches"])
def test_speculative_engine_on_real_vllm(backends, preset):
    _, engine = engine_for(backends, f"optim={preset}", "optim.roofline_memory=false", "search.max_iterations=3",
                           "optim.eos_at_depth_limit=false", *WORDY_STEPS)
    out = next(iter(engine.run([ProblemInput("q3", WORDY)])))
    m = out.metrics
    assert m.spec_generated > 0 and 0 <= m.spec_used <= m.spec_generated
    assert all(b.text == "".join(s.text for s in b.steps) for b in out.candidates)
    assert engine.gen.num_unfinished() == 0  # no speculative request left behind


def final_candidates(engine, problem: str):
    out = next(iter(engine.run([ProblemInput("q4", problem)])))
    return sorted(b.text for b in out.candidates), out.metrics


def test_run_on_speculation_keeps_the_baseline_tree_with_position_sampling(backends):
    """Run-on speculation with every duplicate starting afresh (truncate ratio 0) adopts, for
    child 0, exactly the step its own request would sample: same final candidates as the
    baseline. (The same run with `generator.sampler=vllm` ends with other candidates: the
    run-on tokens come from another random stream.)"""
    common = ["search.max_iterations=4", "optim.eos_at_depth_limit=false", "generator.step_max_tokens=40",
              "generator.max_total_tokens=160", *EXACT]
    _, base = engine_for(backends, "optim=baseline", *common)
    expected, _ = final_candidates(base, "What is 10 - 4?")
    _, spec = engine_for(backends, "optim=PMS", "optim.roofline_memory=false", "optim.spec_truncate_ratio=0",
                         "optim.spec_truncate_std=0", *common)
    got, m = final_candidates(spec, "What is 10 - 4?")
    assert spec.gen.resumable_sampling and m.spec_used > 0
    assert got == expected


@pytest.mark.parametrize("dtype, position", [("float32", True), ("bfloat16", False)])
def test_auto_sampler_is_position_only_where_logits_are_exact(backends, dtype, position):
    _, engine = engine_for(backends, f"generator.dtype={dtype}", "generator.sampler=auto")
    assert engine.gen.resumable_sampling is position
    assert engine.gen.llm.llm_engine.model_config.dtype == getattr(__import__("torch"), dtype)


def test_bf16_search_is_a_valid_search(backends):
    """PMS in bf16, explicitly (so a float32 host runs the bf16 path too): every final path
    is its steps, scores are probabilities, speculation is accounted for, nothing is left
    running. Exact trees are not asserted: bf16 logits move with the batch."""
    cfg, engine = engine_for(backends, "optim=PMS", "optim.roofline_memory=false", "generator.dtype=bfloat16",
                             "verifier.dtype=bfloat16", "search.max_iterations=3", "optim.eos_at_depth_limit=false",
                             *WORDY_STEPS)
    out = next(iter(engine.run([ProblemInput("b1", WORDY)])))
    assert len(out.candidates) == cfg.search.n
    for beam in out.candidates:
        assert beam.text == "".join(s.text for s in beam.steps)
        assert beam.num_tokens <= cfg.generator.max_total_tokens
        assert all(s is not None and 0.0 <= s <= 1.0 for s in beam.scores)
    m = out.metrics
    assert m.spec_generated > 0 and 0 <= m.spec_used <= m.spec_generated
    assert engine.gen.num_unfinished() == 0


def test_decoupled_engine_on_real_vllm(backends):
    """The decoupled engine (separate LLM and PRM queues, speculation on the likely
    survivors) on vLLM, two problems in flight: every problem completes, the PRM scores
    one step per beam per call, in order, and the speculative tokens are accounted for
    (used + wasted = generated). (That it never scores a speculative step is
    `test_decoupled.py`'s, on the fake.)"""
    from tests.test_decoupled import scored_in_order

    cfg, engine = engine_for(backends, "optim=decoupled", "bench.concurrency=2", "search.max_iterations=3",
                             "optim.eos_at_depth_limit=false")
    calls = []  # the verifier's requests, call by call, as a run's trace records them
    remove = engine.verifier.add_result_observer(lambda requests, scores: calls.append(list(requests)))
    problems = [ProblemInput("d1", "What is 10 - 4?"), ProblemInput("d2", "What is 3 * 5?"),
                ProblemInput("d3", "What is 9 + 8?")]
    try:
        outs = {o.problem.id: o for o in engine.run(problems)}
    finally:
        remove()
    assert set(outs) == {"d1", "d2", "d3"}
    for out in outs.values():
        assert len(out.candidates) == cfg.search.n
        for beam in out.candidates:
            assert beam.text == "".join(s.text for s in beam.steps)
            assert all(s is not None and 0.0 <= s <= 1.0 for s in beam.scores)
    scored_in_order(calls)  # one step per beam per call, the shallowest its path has unscored
    scored = sum(len(c) for c in calls)
    d = engine.schedule.stats
    assert scored > 0 and engine.collector.work.calls["select"] > 0 and d.problems_started == 3 and d.max_live == 2
    spec = engine.collector.speculation
    assert spec.generated > 0 and spec.generated == spec.used + spec.wasted
    assert engine.gen.num_unfinished() == 0  # no request left behind
    assert engine.step_logs()["decoupled"]["llm_steps"] == engine.collector.logs["generator"].steps > 0


# run_bench builds and closes its own engines, which tears down vLLM's global groups under
# the module's engines: the tests that use `backends` come before it.


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A small real run (two problems, the baseline), shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("real_run")
    return run_bench(compose("config", TINY + ["dataset.first_k=2", f"bench.results_dir={tmp}", "bench.run_name=r",
                                               "bench.raw_generator=true", "ceiling.repeats=1"]))


def test_run_bench_embedded_writes_complete_records(real_run):
    path = real_run
    records = RunStore(path).records()
    assert len(records) == 2
    for r in records:
        assert r["variant"] == "baseline" and len(r["candidates"]) == 4
        assert set(r["verdicts"]) == {"majority", "weighted", "prm_max"}
        assert all(v["reason"] in ("correct", "wrong", "no_answer", "unparsable", "timeout")
                   for v in r["verdicts"].values())
        m = r["metrics"]
        assert m["latency_s"] >= m["generator_s"] > 0 and m["verifier_s"] > 0
    whole = json.loads((path / "summary.json").read_text())
    summary = whole["variants"]["baseline"]
    for key in ("precise_goodput", "latency_s_mean", "generator_s_mean", "verifier_s_mean", "tokens_per_s",
                "gen_cache_hit_rate", "ver_cache_hit_rate", "gen_batch_util_mean", "straggler_gap", "acc_majority"):
        assert key in summary, key
    assert sum(summary["generator"]["batch_util_hist"]) > 0
    # the host time's split: vLLM's request calls were timed between steps, every selection
    # was timed, and the parts add up to the wall time outside both models' steps
    gen_cost, ver_cost = summary["generator"]["cost"], summary["verifier"]["cost"]
    assert "calls_s" in gen_cost and "select_ms_mean" in summary  # timed: present, not sized
    assert summary["host_s"] == pytest.approx(summary["wall_s"] - gen_cost["wall_s"] - ver_cost["wall_s"])
    parts = ("host_engine_s", "host_backend_calls_s", "host_verifier_s", "host_select_s", "host_record_s")
    assert sum(summary[k] for k in parts) == pytest.approx(summary["host_s"])
    # the block pools' counts: every problem's requests looked their prompt blocks up
    blocks = summary["kv_blocks"]
    assert set(blocks) == {"generator", "verifier"}
    assert blocks["generator"]["lookups"] >= 2 * 4 and blocks["generator"]["hits"] > 0
    assert summary["gen_thrash_blocks"] == blocks["generator"]["thrash_blocks"] >= 0
    assert summary["gen_evictions"] == blocks["generator"]["evictions"] >= 0
    # the step cost model, fitted on the run's own steps, and the bound it puts on the work.
    # Its coefficients are timed, so only what holds on every host is asserted (a 2-problem
    # fit's prefill cost came out 0 on a host where prefill is cheap against a step): the
    # reported model is the fit of the run's own step sums, no coefficient is negative, and
    # the bounds are that model applied to the work the records count
    assert_bounds_are_the_fit_applied_to_the_work(whole, summary, records)
    # raw vLLM timed first at the run's sequences in flight, and each variant against it
    raw = whole["raw_generator"]
    assert raw["batch"] == 4 and raw["new_tokens"] == 12 and raw["repeats"] == 1
    assert raw["tok_s"] == pytest.approx(statistics.median(raw["tok_s_runs"])) and raw["tok_s"] > 0
    assert raw["single_tok_s"] == pytest.approx(statistics.median(raw["single_tok_s_runs"]))
    assert len(raw["tok_s_runs"]) == len(raw["single_tok_s_runs"]) == 1
    assert summary["gen_phase_tok_s"] == pytest.approx(summary["total_gen_tokens"] / summary["generator"]["model_s"])
    assert summary["gen_phase_vs_raw"] == pytest.approx(summary["gen_phase_tok_s"] / raw["tok_s"])
    assert summary["gen_phase_vs_raw"] > 0
    assert summary["goodput_vs_ceiling"] == pytest.approx(summary["precise_goodput"] / raw["single_tok_s"])


def assert_bounds_are_the_fit_applied_to_the_work(whole: dict, summary: dict, records: list[dict]) -> None:
    """What a run's cost model and bounds must satisfy on any host, whatever the timings."""
    from dataclasses import asdict

    from tts.metrics.cost_model import COST, CostModel, CostSums, fit, work_bounds

    models, caps = {}, {}
    for model in ("generator", "verifier"):
        sums = CostSums.from_dict(summary[model][COST])
        reported = whole["cost_model"][model]
        assert reported == pytest.approx(asdict(fit(sums))) and reported["steps"] == summary[model]["steps"]
        coefficients = (reported["step_s"], reported["per_decode_seq_s"], reported["per_prefill_token_s"])
        assert min(coefficients) >= 0 and max(coefficients) > 0  # every step took time
        assert reported["r2"] <= 1
        models[model], caps[model] = CostModel(**reported), (sums.batch_cap, sums.token_cap)
    per = [work_bounds([r["metrics"]], models["generator"], models["verifier"], caps["generator"],
                       caps["verifier"]) for r in records]
    assert summary["gen_bound_s_mean"] == pytest.approx(statistics.fmean(b["gen_bound_s"] for b in per))
    assert summary["ver_bound_s_mean"] == pytest.approx(statistics.fmean(b["ver_bound_s"] for b in per))
    assert summary["gen_bound_s_mean"] > 0 and summary["ver_bound_s_mean"] >= 0
    assert summary["bound_share"] == pytest.approx(summary["latency_bound_s_mean"] / summary["latency_s_mean"])
    assert ("bound_fit_note" in summary) == (summary["bound_share"] > 1)
    parts = ("host_s", "gen_steps_s", "ver_steps_s", "recomputed_s", "residual_s")
    assert sum(summary[f"above_{p}"] for p in parts) == pytest.approx(summary["above_bound_s"])


def test_replaying_a_real_run_on_its_own_fitted_cost_model_gives_back_its_times(real_run):
    """The trace of a real vLLM run, replayed with the run's own fitted step model on the
    same device: the same trees, nothing drawn, the same tokens, and every simulated step
    priced at the fitted model (how close that comes to the measured times depends on the
    fit, so on the host: benchmarks show it, `docs/results.md`)."""
    from tts.replay.run import run_replay

    replayed = run_replay(real_run, [])
    recorded, simulated = RunStore(real_run), RunStore(replayed)
    def tree(store):
        return [[(c["text"], c["score"]) for c in r["candidates"]] for r in store.records()]
    assert tree(simulated) == tree(recorded)
    summary = simulated.summary()
    served = summary["simulated"]["served"]["baseline"]
    assert served["drawn_tokens"] == 0 and served["drawn_scores"] == 0 and served["requests"] > 0
    assert summary["host"]["simulated"] and summary["simulated"]["cost"] == "fitted"
    against = summary["simulated"]["against_recorded"]["variants"]["baseline"]
    for key in ("generator_s_mean", "verifier_s_mean", "latency_s_mean"):
        assert against[key]["replayed/recorded"] > 0, (key, against[key])
    from tts.metrics.cost_model import COST, CostModel, CostSums

    fitted = recorded.summary()["cost_model"]
    for model in ("generator", "verifier"):  # each simulated step costs what the fit says
        sums = CostSums.from_dict(summary["variants"]["baseline"][model][COST])
        assert sums.steps > 0
        assert CostModel(**fitted[model]).time(*sums.xtx[0]) == pytest.approx(sums.wall_s, rel=1e-3), model
    assert summary["variants"]["baseline"]["total_gen_tokens"] == \
        recorded.summary()["variants"]["baseline"]["total_gen_tokens"]


def test_too_small_kv_budget_is_a_clear_error_before_loading():
    cfg = validate(compose("config", TINY + ["memory.kv_cache_gib=0.0001"]))
    with pytest.raises(ValueError, match="KV|kv"):
        Backends(cfg).get(*static_split(cfg))


def test_missing_model_folder_is_a_clear_error(tmp_path):
    cfg = validate(compose("config", TINY + [f"generator.model={tmp_path}/nope"]))
    with pytest.raises(FileNotFoundError, match="nope"):
        Backends(cfg).get(*static_split(cfg))



def _without_timing(record: dict) -> dict:
    """A record less what the clock decides (seconds, rates, and completion times)."""
    timing = ("_s", "goodput", "per_s", "per_min", "completion")
    metrics = {k: v for k, v in record["metrics"].items() if not any(t in k for t in timing)}
    candidates = [{k: v for k, v in c.items() if k != "completed_at"} for c in record["candidates"]]
    return {**{k: v for k, v in record.items() if k not in ("metrics", "variant_wall_s")},
            "metrics": metrics, "candidates": candidates}


def test_killed_and_resumed_run_repeats_the_uninterrupted_records(tmp_path):
    """float32, concurrency 1: a run killed during its second problem and resumed in a fresh
    engine has the uninterrupted run's records, timing aside. Each problem starts on empty
    prefix caches (bench.fresh_cache_per_problem), so the re-run problem sees what it saw
    the first time."""
    args = TINY + EXACT + ["dataset.first_k=2", "search.max_iterations=3", f"bench.results_dir={tmp_path}"]
    whole = RunStore(run_bench(compose("config", args + ["bench.run_name=whole"]))).records()
    killed = shutil.copytree(tmp_path / "whole", tmp_path / "killed")  # the same run, killed in problem 2
    config = killed / "config.yaml"
    config.write_text(config.read_text().replace("run_name: whole", "run_name: killed"))
    lines = (killed / "records.jsonl").read_text().splitlines(keepends=True)
    (killed / "records.jsonl").write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # torn mid-write
    resumed = RunStore(run_bench(compose("config", args + ["bench.run_name=killed", "bench.resume=true"]))).records()
    assert len(whole) == len(resumed) == 2
    assert [_without_timing(r) for r in resumed] == [_without_timing(r) for r in whole]
    assert whole[1]["metrics"]["gen_cached_tokens"] == resumed[1]["metrics"]["gen_cached_tokens"]


def test_ceiling_benchmark_times_every_path_on_equal_work(tmp_path):
    cfg = compose("ceiling", ["logger=none", "dataset=embedded", "ceiling.batches=[1,3]", "ceiling.new_tokens=6",
                              "ceiling.repeats=1", f"bench.results_dir={tmp_path}", "bench.run_name=c"])
    summary = json.loads((run_bench(cfg) / "summary.json").read_text())
    rows = summary["ceiling"]
    assert [(r["batch"], r["sampler"]) for r in rows] == [(1, "vllm"), (1, "position"), (3, "vllm"), (3, "position")]
    for r in rows:
        assert r["raw_tok_s"] > 0 and r["engine_tok_s"] > 0
        assert r["ratio"] == pytest.approx(r["engine_tok_s"] / r["raw_tok_s"])  # one repeat: the ratio of the two
    assert summary["host"]["dtype"]["generator"] in ("bfloat16", "float32")
    assert "| batch | raw tok/s |" in summary["ceiling_table_md"]
