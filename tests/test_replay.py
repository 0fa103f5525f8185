"""Trace recording and replay (`tts replay`) on the fake backend: the trace survives a kill
and a resume, a replay of the same engine reproduces its tree exactly, what the trace
does not hold is drawn and counted, and the simulated engines' cost and memory rules."""

import gzip
import json

import pytest

from tts.backends.prefix_cache import PrefixCache, block_keys
from tts.clock import VirtualClock, now, simulated
from tts.config.compose import ConfigError, compose
from tts.memory.device import load_device
from tts.metrics.cost_model import CostModel
from tts.replay.sim_engine import SimEngine, Slot
from tts.metrics.step_cost import FittedCost, RooflineCost
from tts.replay.run import run_replay
from tts.results.store import RunStore
from tts.runner import run_bench
from tts.token_hash import extend_hash
from tts.trace.format import TRACE, read_trace

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
        "search.beam_width=2", "search.max_iterations=5"]


def bench(tmp_path, *extra, name="run"):
    return run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra]))


def trees(path):
    return {(r["variant"], r["problem_id"]): [(c["text"], c.get("score")) for c in r["candidates"]]
            for r in RunStore(path).records()}


@pytest.mark.parametrize("sampler", ["position", "vllm"])
def test_replay_of_the_same_engines_reproduces_their_trees_exactly(tmp_path, sampler):
    """Baseline, PMS (run-on speculation, lookahead) and decoupled exploration: each
    replayed variant's candidates, texts and scores, are the recorded ones, and nothing
    was drawn."""
    path = bench(tmp_path, "bench.compare=[baseline,PMS,decoupled]", f"generator.sampler={sampler}")
    replayed = run_replay(path, [])
    assert trees(replayed) == trees(path)
    served = RunStore(replayed).summary()["simulated"]["served"]
    for name, counts in served.items():
        assert counts["requests"] > 0 and counts["drawn_tokens"] == 0 and counts["drawn_scores"] == 0, name
    assert served["baseline"]["recorded"] == served["baseline"]["requests"]


def test_replays_of_one_run_at_other_options_land_in_their_own_folders(tmp_path):
    """The folder's name carries the options not at their defaults: the datasheet's price
    beside the measured one, without naming either."""
    path = bench(tmp_path, "bench.compare=[baseline]")
    measured = run_replay(path, [])
    datasheet = run_replay(path, ["replay.step_costs=datasheet", "replay.host=none"])
    assert measured != datasheet and measured.exists() and datasheet.exists()
    assert datasheet.name == f"{measured.name}-step_costs-datasheet-host-none"
    assert "step_costs" not in measured.name


def test_another_engines_speculation_is_drawn_and_counted(tmp_path):
    """A baseline-only trace replayed with PMS: PMS's run-on tokens past the baseline's step
    ends are not in the trace; they are drawn, and the replay says how many."""
    path = bench(tmp_path, "bench.compare=[baseline]")
    replayed = run_replay(path, ["bench.compare=[baseline,PMS]"])
    served = RunStore(replayed).summary()["simulated"]["served"]
    assert served["baseline"]["drawn_tokens"] == 0
    assert served["PMS"]["drawn_tokens"] > 0 and 0 < served["PMS"]["drawn_token_share"] < 1
    assert served["PMS"]["borrowed_tokens"] > 0 and served["baseline"]["borrowed_tokens"] == 0  # the baseline's


def test_the_trace_survives_a_kill_and_a_resume(tmp_path):
    """A run killed after its first problem, with its last trace member cut off, then
    resumed: the trace reads back (the cut member dropped and said), and the replay of the
    resumed run reproduces the uninterrupted run's trees."""
    first = [o for o in FAKE if not o.startswith("dataset.first_k")]
    killed = run_bench(compose("config", first + ["dataset.first_k=1", f"bench.results_dir={tmp_path}",
                                                  "bench.run_name=run"]))
    raw = (killed / TRACE).read_bytes()
    (killed / TRACE).write_bytes(raw + gzip.compress(b'{"t":"s","k":"x","d":0,"r":0.5}\n')[:-9])
    assert read_trace(killed / TRACE).truncated
    resumed = bench(tmp_path, "bench.resume=true")
    whole = bench(tmp_path, name="uninterrupted")
    assert trees(resumed) == trees(whole)
    assert trees(run_replay(resumed, [])) == trees(whole)


def test_a_trace_that_is_not_one_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no trace here"):
        read_trace(tmp_path / TRACE)
    (tmp_path / TRACE).write_bytes(gzip.compress(b'{"t":"h","version":1}\nnot json\n'))
    with pytest.raises(ValueError, match=r"line 2"):
        read_trace(tmp_path / TRACE)


def test_bad_replay_overrides_name_the_field_and_the_choices(tmp_path):
    path = bench(tmp_path, "bench.compare=[baseline]", "dataset.first_k=1")
    with pytest.raises(ConfigError, match="replay.cost.*fitted, roofline"):
        run_replay(path, ["replay.cost=exact"])
    with pytest.raises(ConfigError, match="replay.speed"):
        run_replay(path, ["replay.speed=2"])
    with pytest.raises(ValueError, match="roofline needs real model shapes"):
        run_replay(path, ["replay.cost=roofline"])
    with pytest.raises(ConfigError, match="search=beam: a replay keeps the recorded run's search.*device, generator"):
        run_replay(path, ["search=beam"])
    assert run_replay(path, ["logger=none"]).exists()  # a replay never logs: accepted, nothing changes
    with pytest.raises(ConfigError, match="(?s)logger/bogus.*none"):
        run_replay(path, ["logger=bogus"])


def test_cost_from_prices_a_trace_with_another_runs_fitted_step_models(tmp_path):
    """`replay.cost_from`: the tree is the trace's, the step models the named run's (its
    fit, named in the host line with its host); a folder without a finished run, a run of
    other models and a roofline cost are refused, naming the option."""
    path = bench(tmp_path, "bench.compare=[baseline,PMS]", "dataset.first_k=1", name="trace")
    other = bench(tmp_path, "bench.compare=[baseline]", "dataset.first_k=1", "search.n=2", name="prices")
    replayed = run_replay(path, [f"replay.cost_from={other}"])
    assert trees(replayed) == trees(path)
    summary = RunStore(replayed).summary()
    fit = RunStore(other).summary()["cost_model"]["generator"]
    assert summary["simulated"]["cost_models"]["generator"] == FittedCost(CostModel(**fit)).describe()
    assert summary["simulated"]["cost_from"]["run"] == str(other)
    own = RunStore(run_replay(path, [], tmp_path / "own")).summary()["simulated"]["cost_models"]["generator"]
    assert own != summary["simulated"]["cost_models"]["generator"]
    from tts.results.host import simulated_line

    assert f"fitted step cost of run {other.name} (measured on " in simulated_line(summary["host"])
    with pytest.raises(ConfigError, match="replay.cost_from: .*/nothing: no such run folder$"):
        run_replay(path, [f"replay.cost_from={tmp_path / 'nothing'}"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"replay.cost_from: .*/empty: not a run folder \(no records.jsonl"):
        run_replay(path, [f"replay.cost_from={tmp_path / 'empty'}"])
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "records.jsonl").write_text((other / "records.jsonl").read_text())
    with pytest.raises(ConfigError, match="replay.cost_from: .*/killed: no summary.json .the run did not finish"):
        run_replay(path, [f"replay.cost_from={tmp_path / 'killed'}"])
    with pytest.raises(ConfigError, match="replay.cost_from: .*roofline"):
        run_replay(path, [f"replay.cost_from={other}", "replay.cost=roofline"])
    summary_path = other / "summary.json"  # a pricing run in bf16: the replay's models run in bf16 too
    priced = json.loads(summary_path.read_text())
    priced["host"]["dtype"] = {"generator": "bfloat16", "verifier": "bfloat16"}
    summary_path.write_text(json.dumps(priced))
    as_priced = RunStore(run_replay(path, [f"replay.cost_from={other}"], tmp_path / "bf16")).saved_config()
    assert as_priced["generator"]["dtype"] == as_priced["verifier"]["dtype"] == "bfloat16"
    named = RunStore(run_replay(path, [f"replay.cost_from={other}", "generator.dtype=float32"],
                                tmp_path / "named")).saved_config()
    assert (named["generator"]["dtype"], named["verifier"]["dtype"]) == ("float32", "bfloat16")
    config = other / "config.yaml"
    config.write_text(config.read_text().replace("model: fake", "model: other", 1))
    with pytest.raises(ConfigError, match="replay.cost_from: .* ran generator 'other'"):
        run_replay(path, [f"replay.cost_from={other}"])


def test_a_resumed_prompt_is_served_the_rest_of_its_recorded_step():
    """With a resumable sampler, a prompt that is a recorded prompt plus the first k tokens
    of its output is served the rest of that output; without, it is not found."""
    from tts.trace.format import Generation, Trace

    trace = Trace({"t": "h"})
    trace.add({"t": "g", "seed": 7, "h": extend_hash(0, [1, 2]), "o": [5, 6, 7], "f": "eos"})
    resumed = extend_hash(0, [1, 2, 5])
    assert trace.generation(7, resumed, resumable=True) == (Generation((5, 6, 7), "eos", False), 1)
    assert trace.generation(7, resumed, resumable=False) is None
    assert trace.generation(8, resumed, resumable=True) is None


def test_each_variant_is_served_its_own_recorded_outputs_in_the_order_sent():
    """The n-th request of a (seed, prompt) in a variant gets the n-th that variant sent (a
    speculative one preferring one recorded as speculation); then another variant's; then
    its own again. An aborted output goes on in a longer recording of the same request.
    Scores likewise."""
    from tts.replay.reader import VariantReader, Whose
    from tts.trace.format import Trace

    trace = Trace({"t": "h"})
    h = extend_hash(0, [1, 2])
    for n, (v, out, spec, f) in enumerate([("PMS", [9, 9], False, "eos"), ("base", [5], False, "aborted"),
                                           ("base", [6, 7], True, "eos"), ("base", [5, 8], False, "eos")]):
        trace.add({"t": "g", "v": v, "seed": 7, "h": h, "o": out, "f": f, "spec": spec, "n": 3 - n})
    base = VariantReader(trace, "base")  # sent in the order of "n": [5, 8], [6, 7], [5], then PMS's
    assert base.take(7, h, True)[0].tokens == (6, 7)
    assert [(g.tokens, whose) for g, whose, _ in (base.take(7, h, False) for _ in range(3))] == [
        ((5, 8), Whose.OWN), ((5,), Whose.OWN), ((9, 9), Whose.BORROWED)]
    assert base.take(7, h, False)[0].tokens == (9, 9)  # another's, not its own again
    found = base.extending(7, h, [5])  # the aborted [5] goes on in the same request's [5, 8]
    assert (found[0].tokens, found[1:]) == ((5, 8), (1, Whose.OWN))
    trace.add({"t": "g", "v": "PMS", "seed": 8, "h": h, "o": [4], "f": "eos", "n": 4})
    pms = VariantReader(trace, "PMS")
    assert [(g.tokens, whose, again) for g, whose, again in (pms.take(7, h, False) for _ in range(2))] == [
        ((9, 9), Whose.OWN, False), ((5, 8), Whose.BORROWED, False)]
    assert [(g.tokens, whose, again) for g, whose, again in (pms.take(8, h, False) for _ in range(2))] == [
        ((4,), Whose.OWN, False), ((4,), Whose.OWN, True)]  # no other variant sent it: its own again
    assert base.take(9, h, False) is None
    for v, r in [("base", 0.1), ("PMS", 0.5), ("base", 0.2)]:
        trace.add({"t": "s", "v": v, "k": "k", "d": 0, "r": r})
    assert [base.score("k") for _ in range(3)] == [(0.1, Whose.OWN), (0.2, Whose.OWN), (0.5, Whose.BORROWED)]
    assert VariantReader(trace, "other").score("k") == (0.2, Whose.BORROWED) and base.score("x") is None


def test_the_virtual_clock_moves_only_when_told():
    clock = VirtualClock()
    with simulated(clock):
        assert now() == 0.0
        clock.advance(1.5)
        assert now() == 1.5
    assert now() != 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def _engine(batch_cap=4, token_cap=64, kv_blocks=100, block=4):
    cost = FittedCost(CostModel(0.01, 0.001, 0.0001, steps=10, r2=1.0))
    return SimEngine(cost, PrefixCache(block, kv_blocks), batch_cap, token_cap, kv_blocks)


def test_the_simulated_engine_prefills_less_its_cached_blocks_then_decodes():
    eng = _engine()
    eng.waiting.append(Slot(list(range(10))))
    sampled, seconds, tokens = eng.step()
    assert tokens == (10,) and seconds == pytest.approx(0.01 + 10 * 0.0001) and len(sampled) == 1
    slot = sampled[0]
    sampled, seconds, tokens = eng.step()  # now it decodes
    assert tokens == (1,) and seconds == pytest.approx(0.011)
    eng.release(slot)
    eng.waiting.append(Slot(list(range(12))))  # shares the first two full blocks
    _, _, tokens = eng.step()
    assert tokens == (4,) and eng.running[0].cached == 8


def test_the_simulated_engine_keeps_to_the_batch_cap_the_token_budget_and_the_kv_cache():
    eng = _engine(batch_cap=2)
    eng.waiting.extend(Slot([i] * 5) for i in range(3))
    _, _, tokens = eng.step()
    assert len(tokens) == 2 and len(eng.waiting) == 1
    eng = _engine(token_cap=6)
    eng.waiting.append(Slot(list(range(10))))
    assert eng.step()[2] == (6,) and eng.step()[2] == (4,)  # a long prompt prefills in chunks
    eng = _engine(kv_blocks=4, block=4)
    eng.waiting.extend(Slot([i] * 10) for i in range(2))  # 3 blocks each: only one fits
    eng.step()
    assert len(eng.running) == 1 and len(eng.waiting) == 1


def test_the_simulated_engines_kv_usage_is_vllms_after_a_step_the_computed_tokens_blocks():
    """vLLM's block pool, read after a step, holds the blocks of the tokens computed; a token
    just sampled gets its block in the next step's schedule. Counting that block early
    put a replay's usage over speculation's memory limit (0.95) a step before vLLM's, and
    PMS's replay at n=128 left its recording there."""
    eng = _engine(kv_blocks=10, block=4)
    eng.waiting.append(Slot(list(range(8))))  # a prompt of two full blocks
    slot = eng.step()[0][0]
    slot.ids.append(99)  # its first token, sampled: alone in a third block, not yet computed
    assert eng.in_use() == 3  # what the next step needs
    assert eng.stats((8,), 0.0).kv_usage == pytest.approx(2 / 10)
    eng.step()
    slot.ids.append(100)  # 99 computed in the third block; 100 joins it
    assert eng.stats((1,), 0.0).kv_usage == pytest.approx(3 / 10)


def test_the_simulated_engine_preempts_the_last_admitted_when_decoding_runs_out_of_blocks():
    """vLLM V1's rule: the sequence admitted last gives its blocks back, waits at the head of
    the queue, and is prefilled again (prompt and generated tokens) less what the cache keeps."""
    eng = _engine(kv_blocks=6, block=4)
    first, second = Slot([1] * 10), Slot([2] * 10)  # 3 blocks each (2 full, 1 not): both fit
    eng.waiting.extend([first, second])
    eng.step()
    assert eng.running == [first, second]
    for slot in (first, second):  # both grow to 13 tokens: 4 blocks each, 8 > 6
        slot.ids += [0, 0, 0]
    _, _, tokens = eng.step()
    assert eng.running == [first] and eng.waiting == [second] and tokens == (1,)
    assert eng.cache.counts()["preemptions"] == 1
    eng.release(first)
    _, _, tokens = eng.step()  # re-admitted: its first two full blocks are still cached
    assert eng.running == [second] and second.cached == 8 and tokens == (5,)


def test_the_simulated_engine_holds_a_shared_prefix_once_as_vllms_block_pool_does():
    """Sequences that share a prompt's full blocks hold them once (vLLM's running requests
    share a cached block by reference): two siblings of 10 tokens over an 8-token prefix hold
    2 shared blocks and a block each for their own tokens, 4 of a 5-block pool, where alone
    each would take 3. A held block is never evicted; only the cached blocks nobody holds
    give way to what the running sequences hold."""
    eng = _engine(kv_blocks=5, block=4)
    prefix = list(range(8))
    a, b = Slot(prefix + [100, 101]), Slot(prefix + [200, 201])
    eng.waiting.extend([a, b])
    _, _, tokens = eng.step()
    assert eng.running == [a, b] and eng.in_use() == 4
    assert tokens == (10, 2) and b.cached == 8  # b reads the blocks a's prefill computes
    eng.waiting.append(Slot([7] * 6))  # 1 full block and 1 for its next token: 4 + 2 > 5
    eng.step()
    assert len(eng.running) == 2 and len(eng.waiting) == 1
    eng.release(a)  # its own block is cached; the prefix stays held by b
    assert eng.in_use() == 3 and set(eng.cache.held) == set(b.keys)
    eng.cache.evict(reserve=eng.in_use())  # 5 - 3 = 2 cached blocks may stay, held ones aside
    assert all(k in eng.cache._blocks for k in b.keys)
    assert len([k for k in eng.cache._blocks if k not in eng.cache.held]) <= 2


def test_the_simulated_engine_caches_a_second_copy_as_a_block_of_its_own():
    """Two sequences that decode the same tokens hold two copies of each block they fill;
    vLLM caches both once their sequences leave, and evicts (and counts) each on its own."""
    eng = _engine(kv_blocks=6, block=4)
    a, b = Slot([1, 2, 3]), Slot([1, 2, 3])
    eng.waiting.extend([a, b])
    eng.step()
    for slot in (a, b):
        slot.ids += [4, 5]  # each fills the block [1, 2, 3, 4] itself: a first copy and a second
    assert eng.in_use() == 4 and a.copies == set() and len(b.copies) == 1
    eng.release(a)
    eng.release(b)
    assert len(eng.cache) == 2 and eng.in_use() == 0  # one hash, two cached blocks
    eng.waiting.append(Slot([9] * 21))  # 5 full blocks and 1 for its next token: 6 of 6
    eng.step()
    assert eng.cache.counts()["evictions"] == 2 and next(block_keys([1, 2, 3, 4], 4)) not in eng.cache


def test_the_roofline_step_is_memory_bound_in_decode_and_compute_bound_in_prefill():
    from tts.assembly.memory_split import model_shape

    shape = model_shape("qwen2.5-math-1.5b-instruct", "bfloat16")
    h100 = load_device("h100")
    cost = RooflineCost(shape, h100, launch_s=0.0)
    one = cost.step_s([500], [])
    assert one == pytest.approx(shape.weight_bytes / (h100.bandwidth_gbs * 1e9), rel=0.05)  # the weights' read
    assert cost.step_s([500] * 16, []) < 1.2 * one  # 16 sequences cost little more than one
    prefill = cost.step_s([], [(4096, 0)])
    assert prefill == pytest.approx(2 * shape.num_params * 4096 / (h100.peak_tflops * 1e12), rel=0.3)
    assert RooflineCost(shape, h100, launch_s=0.002).step_s([500], []) == pytest.approx(one + 0.002)
    assert cost.step_s([], []) == 0.0


def test_paper_models_are_priced_from_the_registry_without_their_weights():
    from tts.assembly.memory_split import model_shape

    small, large = (model_shape(m, "bfloat16") for m in ("Qwen/Qwen2.5-Math-1.5B-Instruct",
                                                          "qwen2.5-math-7b-instruct"))
    assert 1.4e9 < small.num_params < 1.6e9 and 7.4e9 < large.num_params < 7.8e9
    assert small.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2


def test_tts_replay_prints_a_simulated_host_line(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    path = bench(tmp_path, "bench.compare=[baseline,PMS]", "dataset.first_k=1")
    result = CliRunner().invoke(app, ["replay", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "SIMULATED" in result.output and "simulated/recorded" in result.output
    bad = CliRunner().invoke(app, ["replay", str(path), "device=h100,a100"])
    assert bad.exit_code == 2 and "add -m" in bad.output
    summary = json.loads(next((tmp_path / "out").glob("*/summary.json")).read_text())
    assert summary["host"]["simulated"] and summary["simulated"]["cost"] == "fitted"
    swept = CliRunner().invoke(app, ["replay", str(path), "-m", "memory.working_set_fraction=0.5,1.0",
                                     "--out", str(tmp_path / "sweep")])
    assert swept.exit_code == 0, swept.output
    assert len(list((tmp_path / "sweep").glob("*/*/summary.json"))) == 2


def test_tts_report_plots_a_replays_ratios_by_device(tmp_path):
    from tts.report import write_report

    path = bench(tmp_path, "bench.compare=[baseline,PMS]", "dataset.first_k=1")
    replayed = run_replay(path, ["replay.speculation=recorded"])
    out = write_report([str(replayed)], None, tmp_path / "report")
    text = out.read_text()
    assert (tmp_path / "report" / "ratio_by_device.png").exists()
    assert "SIMULATED" in text


def iterations(path):
    return {(r["variant"], r["problem_id"]): r["metrics"]["iterations"] for r in RunStore(path).records()}


def test_a_bf16_trace_replays_each_variant_from_its_own_recording(tmp_path):
    """A bf16 fake (its tokens depend on the batch a request is first scheduled in, as bf16
    logits do) recorded as baseline and PMS: the same request gives other tokens in the two
    variants, and each replayed variant is served its own. The baseline's replay draws and
    borrows nothing, and its tree is the recorded one: the same final candidates, the same
    iterations."""
    path = bench(tmp_path, "bench.compare=[baseline,PMS]", "generator.dtype=bfloat16", "search.n=8",
                 "search.beam_width=2", "search.max_iterations=8")
    outputs: dict = {}
    for line in gzip.decompress((path / TRACE).read_bytes()).decode().splitlines()[1:]:
        if (g := json.loads(line))["t"] == "g":
            outputs.setdefault((g["seed"], g["h"]), {}).setdefault(g["v"], set()).add(tuple(g["o"]))
    assert any(len(by) == 2 and by["baseline"] != by["PMS"] for by in outputs.values())  # the variants differ
    replayed = run_replay(path, [])
    base = {k: v for k, v in trees(replayed).items() if k[0] == "baseline"}
    assert base == {k: v for k, v in trees(path).items() if k[0] == "baseline"}
    assert ({k: v for k, v in iterations(replayed).items() if k[0] == "baseline"}
            == {k: v for k, v in iterations(path).items() if k[0] == "baseline"})
    summary = RunStore(replayed).summary()["simulated"]
    served = summary["served"]
    assert served["baseline"]["drawn_tokens"] == 0 and served["baseline"]["borrowed_tokens"] == 0
    assert served["baseline"]["recorded"] == served["baseline"]["requests"]
    assert "baseline: drew 0 tokens (0.0% of its tokens), borrowed 0" in summary["against_recorded_md"]


def test_the_replays_host_time_is_the_recorded_runs_also_with_problems_in_flight():
    """The host time a replay adds per step and iteration sums to the recorded run's wall
    time less its model steps, with one problem in flight and with several (whose problems
    each count the generator phases they shared)."""
    from tts.replay.setup import host_parts

    def summary(gen_s, ver_s):  # 16 problems, 30 iterations each; 420 s and 170 s of steps in 600 s
        return {"num_problems": 16, "wall_s": 600.0, "iterations_mean": 30.0,
                "generator_s_mean": gen_s / 16, "verifier_s_mean": ver_s / 16,
                "generator": {"cost": {"steps": 11000, "wall_s": 420.0}},
                "verifier": {"cost": {"steps": 140, "wall_s": 170.0}}}

    for gen_s, ver_s in ((426.0, 172.0), (1600.0, 670.0)):  # one in flight; four
        gen, ver, between = host_parts(summary(gen_s, ver_s))
        assert gen * 11000 + ver * 140 + between * 16 * 30 == pytest.approx(600.0 - 420.0 - 170.0)
    assert host_parts(summary(426.0, 172.0)) == pytest.approx((6 / 11000, 2 / 140, 2 / 480))


def test_a_gpu_replay_takes_the_kv_budget_of_the_card():
    """On a GPU device the replay's KV budget is what a run on the card would get
    (`gpu_kv_budget` of its memory), so pressure arrives at large n as on the card; a named
    `memory.kv_cache_gib` stays, and a pair the card cannot hold is named."""
    from tts.assembly.memory_split import gpu_kv_budget
    from tts.backends.factory import GIB
    from tts.config.compose import validate
    from tts.kv_budget import kv_of_the_card

    gpu = ["device=rtx4090", "memory=gpu", "generator=qwen2.5-math-1.5b", "verifier=skywork_1.5b"]
    cfg = compose("config", gpu)
    kv_of_the_card(cfg, [])
    budget = gpu_kv_budget(validate(compose("config", gpu)), int(24e9))
    assert cfg.memory.kv_cache_gib == pytest.approx(budget / GIB, abs=1e-3)
    assert 0 < cfg.memory.kv_cache_gib < 24
    named = compose("config", [*gpu, "memory.kv_cache_gib=3"])
    kv_of_the_card(named, ["memory.kv_cache_gib=3"])
    assert named.memory.kv_cache_gib == 3
    cpu = compose("config", [])
    kv_of_the_card(cpu, [])
    assert cpu.memory.kv_cache_gib == compose("config", []).memory.kv_cache_gib
    too_big = compose("config", ["device=rtx4090", "memory=gpu", "generator=qwen2.5-math-7b", "verifier=qwen_prm_7b"])
    with pytest.raises(ConfigError, match="device=rtx4090"):
        kv_of_the_card(too_big, [])


def test_a_preempted_requests_prefill_again_is_counted(tmp_path):
    """The tokens a model's steps computed beyond the work its records count
    (`gen_recomputed_tokens`): none where the card's KV cache holds the paths, some where
    requests were preempted and their contexts prefilled again."""
    path = bench(tmp_path, "bench.compare=[paper_baseline]", "dataset.first_k=1", "search.n=32", "search.beam_width=4")

    def on_the_card(kv):
        out = run_replay(path, ["device=rtx4090", "generator=qwen2.5-math-1.5b", "verifier=skywork_1.5b",
                                "memory.gpu_free_fraction=null", f"memory.kv_cache_gib={kv}"], run_name=f"kv{kv}")
        return RunStore(out).summary()["variants"]["paper_baseline"]

    roomy, tight = on_the_card(0.2), on_the_card(0.08)
    assert roomy["gen_preemptions"] == 0 and roomy["gen_recomputed_tokens"] == 0
    assert tight["gen_preemptions"] > 0 and tight["gen_recomputed_tokens"] > 0
