"""The decoupled engine on the deterministic fake backend."""

import pytest

from tts.backends.base import StepStats
from tts.backends.fake import EOS_CHAR, FakeGenerator, FakeVerifier, answering_script, endless_script
from tts.config.enums import Algorithm, EngineKind
from tts.config.schema import OptimConfig, SearchConfig
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.engine.options import decoupled_options
from tts.engine.decoupled_policy import (EAGER_FIRST, FILL_POLICIES, SPECULATIVE_FIRST, Adaptive, FillState,
                                         make_fill_policy)
from tts.results.summary import variant_summary
from tts.search import make_policy

POLICIES = ("eager_first", "speculative_first", "adaptive")


endless, answering = endless_script, answering_script


def short(problem, steps, seed):
    """Very short steps: speculation finishes whole steps before selection runs."""
    if len(steps) >= 3 and seed % 3 == 0:
        return f"\\boxed{{{seed % 2}}}{EOS_CHAR}"
    return f"{len(steps)}{seed % 10}\n\n"


class Recorder(FakeVerifier):
    """A fake verifier that records every call's requests."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.hook = None

    def score(self, requests):
        self.calls.append(list(requests))
        if self.hook:
            self.hook(requests)
        return super().score(requests)


def inputs(problems):
    return [ProblemInput(p, f"problem {p}") for p in problems]


def cfg_for(algo, n, m, iters, **kw):
    return SearchConfig(algorithm=algo, n=n, beam_width=m, max_iterations=iters, **kw)


def baseline(script, algo=Algorithm.beam, n=4, m=2, iters=5, problems=("a", "b", "c"), cap=8, search_kw=None,
             verifier=True, sampling="context", **opts):
    cfg = cfg_for(algo, n, m, iters, **(search_kw or {}))
    gen = FakeGenerator(script, batch_cap=cap, sampling=sampling)
    eng = Engine(gen, FakeVerifier() if verifier else None, lambda: make_policy(cfg, 30, 300), "sys",
                     EngineOptions(**opts))
    return list(eng.run(inputs(problems))), eng, gen


def decoupled(script, algo=Algorithm.beam, n=4, m=2, iters=5, problems=("a", "b", "c"), cap=8, policy="eager_first",
              prm_cap=0, verifier=None, search_kw=None, cache_blocks=1 << 20, trace=False, no_verifier=False,
              scope="survivors", sampling="context", **opts):
    cfg = cfg_for(algo, n, m, iters, **(search_kw or {}))
    gen = FakeGenerator(script, batch_cap=cap, cache_blocks=cache_blocks, sampling=sampling)
    ver = None if no_verifier else (verifier or Recorder())
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy=policy, verifier_batch_size=prm_cap,
                        decoupled_spec_scope=scope)
    eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts, decoupled=decoupled_options(optim)), schedule="decoupled")
    if trace:
        eng.schedule.trace = []
    return list(eng.run(inputs(problems))), eng, gen, ver


def candidates(outs):
    return sorted((o.problem.id, [(b.text, b.scores) for b in o.candidates]) for o in outs)


def events(eng, name):
    return [e for e in eng.schedule.trace if e[0] == name]


# ---------------------------------------------------------------- same answers


@pytest.mark.parametrize("algo", [Algorithm.beam, Algorithm.dvts])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("prm_cap", [0, 3])
@pytest.mark.parametrize("scope", ["survivors", "all"])
def test_final_answers_equal_the_baseline(algo, policy, prm_cap, scope):
    base, *_ = baseline(answering, algo, problems=("a", "b", "c", "d"), concurrency=3)
    fast, eng, *_ = decoupled(answering, algo, problems=("a", "b", "c", "d"), policy=policy, prm_cap=prm_cap,
                              concurrency=3, scope=scope)
    assert candidates(fast) == candidates(base)
    assert eng.schedule.stats.max_live == 3
    assert not eng.runner.requests and eng.gen.num_unfinished() == 0


@pytest.mark.parametrize("algo,search_kw", [
    (Algorithm.dynamic_branching, {}),
    (Algorithm.varying_granularity, {"verify_every": 2, "early_steps": 2, "early_step_max_tokens": 5}),
    (Algorithm.best_of_n, {}),
])
def test_other_algorithms_equal_the_baseline(algo, search_kw):
    base, *_ = baseline(answering, algo, search_kw=search_kw, concurrency=2)
    for policy in POLICIES:
        fast, *_ = decoupled(answering, algo, search_kw=search_kw, policy=policy, prm_cap=2, concurrency=2)
        assert candidates(fast) == candidates(base), policy


def test_self_consistency_runs_without_a_verifier():
    base, *_ = baseline(answering, Algorithm.self_consistency, verifier=False, concurrency=2)
    fast, *_ = decoupled(answering, Algorithm.self_consistency, no_verifier=True, concurrency=2)
    assert candidates(fast) == candidates(base)


def test_equal_without_score_cache_and_at_depth_limit_off():
    for opts in ({"score_cache": False}, {"eos_at_depth_limit": False}):
        base, *_ = baseline(endless, iters=4, concurrency=2, **opts)
        fast, *_ = decoupled(endless, iters=4, concurrency=2, policy="speculative_first", prm_cap=2, **opts)
        assert candidates(fast) == candidates(base), opts


# ------------------------------------------------------------- the PRM's queue


def test_prm_never_scores_a_speculative_step():
    holder = {}
    seen = {"spec_live": 0, "items": 0}

    def check(requests):
        eng = holder["eng"]
        assert len(requests) <= 3  # verifier_batch_size
        committed = {(b.problem_id, b.step_texts) for b in eng.schedule.inflight.committed_beams()}
        spec = eng.schedule.speculative_paths()
        seen["spec_live"] += bool(spec)
        for req in requests:
            pid = req.problem.removeprefix("problem ")
            assert len(req.indices) == 1  # one step per beam per call
            path = req.steps[: req.indices[0] + 1]
            assert any(c[0] == pid and c[1][: len(path)] == path for c in committed)
            assert (pid, path) not in spec or (pid, path) in committed
            seen["items"] += 1

    ver = Recorder()
    ver.hook = check
    cfg = cfg_for(Algorithm.beam, 8, 2, 5)
    gen = FakeGenerator(short, batch_cap=16)
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy="speculative_first", verifier_batch_size=3)
    eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(concurrency=2, decoupled=decoupled_options(optim)), schedule="decoupled")
    holder["eng"] = eng
    list(eng.run(inputs(("a", "b", "c"))))
    assert seen["items"] > 0 and seen["spec_live"] > 0  # speculation existed while the PRM ran
    assert eng.collector.speculation.generated > 0


def test_last_scored_advances_one_step_per_score():
    # verification every 2 iterations: beams carry two unscored steps, scored one per call
    _, eng, _, ver = decoupled(endless, Algorithm.varying_granularity, iters=6, trace=True, prm_cap=4,
                               search_kw={"verify_every": 2}, policy="speculative_first", concurrency=2)
    prm = events(eng, "prm")
    assert prm
    for _, _, _, index, before, after, _ in prm:
        assert index == before + 1 and after == before + 1
    by_beam = {}
    for _, _, uid, index, *_ in prm:
        by_beam.setdefault(uid, []).append(index)
    assert any(len(v) >= 2 for v in by_beam.values())  # some beam was scored step by step
    assert all(v == sorted(v) for v in by_beam.values())
    assert all(len(reqs) <= 4 for reqs in ver.calls)
    assert sum(len(reqs) for reqs in ver.calls) == len(prm)  # unique steps: no cache hits
    assert len(ver.scored) == len(set(ver.scored))  # no step scored twice


# --------------------------------------------------------------- speculation


def test_pruned_beams_speculation_is_dropped_and_counted():
    outs, eng, *_ = decoupled(short, n=8, m=4, iters=6, cap=16, trace=True, prm_cap=2,
                              policy="speculative_first", concurrency=2)
    drops = events(eng, "drop")
    assert drops and sum(t for *_, t in drops) > 0
    selects = events(eng, "select")
    frontier_uids = {uid for e in selects for uid, _ in e[3]}
    frontier_parents = {parent for e in selects for _, parent in e[3]}
    for _, parent, shadow, _ in drops:
        assert shadow not in frontier_uids  # a speculative beam never enters a frontier
        assert parent not in frontier_parents  # the pruned beam has no descendants
    d = eng.collector.speculation
    assert d.steps["dropped"] == len(drops)
    assert d.generated == d.used + d.wasted
    assert d.wasted >= sum(t for *_, t in drops)  # partial adoptions may waste a few more
    per_problem = sum(o.metrics.spec_generated - o.metrics.spec_used for o in outs)
    assert per_problem == d.wasted
    logs = eng.step_logs()["speculation"]
    assert logs["spec_wasted"] == d.wasted and 0 < logs["spec_hit_rate"] < 1


def test_kept_beams_speculative_step_is_reused_without_a_request():
    base, _, bgen = baseline(short, n=8, m=4, iters=6, cap=16, concurrency=2)
    fast, eng, gen, _ = decoupled(short, n=8, m=4, iters=6, cap=16, trace=True, prm_cap=1,
                                  policy="speculative_first", concurrency=2)
    assert candidates(fast) == candidates(base)
    whole = [e for e in events(eng, "adopt") if e[3] == "whole"]
    assert whole and eng.collector.speculation.steps["whole"] == len(whole)
    submitted = {e[2] for e in events(eng, "submit")}
    for _, _, child, _, used in whole:
        assert child not in submitted and used > 0
    d = eng.collector.work
    assert len(gen.calls) == sum(d.requests.values())  # every request the engine counted
    real = d.requests["fresh"] + d.requests["eager"]
    spec = eng.collector.speculation
    assert real == len(bgen.calls) - spec.steps["whole"] - spec.steps["promoted"]
    assert sum(o.metrics.spec_used for o in fast) == spec.used > 0


def test_survivor_scope_speculates_the_kept_beams_children():
    kw = dict(n=8, m=4, iters=6, cap=16, trace=True, prm_cap=2, policy="speculative_first", concurrency=2)
    base, *_ = baseline(short, n=8, m=4, iters=6, cap=16, concurrency=2)
    runs = {scope: decoupled(short, scope=scope, **kw)[1] for scope in ("survivors", "all")}
    adopted = {}
    for scope, eng in runs.items():
        per_parent: dict[int, int] = {}
        for _, parent, *_ in events(eng, "adopt"):
            per_parent[parent] = per_parent.get(parent, 0) + 1
        adopted[scope] = per_parent
    assert max(adopted["all"].values()) == 1  # child 0 only
    assert max(adopted["survivors"].values()) > 1  # several children of one kept beam
    surv, every = runs["survivors"].collector.speculation, runs["all"].collector.speculation
    assert surv.used > every.used
    assert surv.used / surv.generated > every.used / every.generated


def test_partial_speculation_under_a_token_cap_keeps_the_result():
    base, *_ = baseline(answering, iters=5, concurrency=2)
    fast, eng, *_ = decoupled(answering, iters=5, concurrency=2, prm_cap=1, policy="speculative_first",
                              spec_max_tokens=3)
    assert candidates(fast) == candidates(base)
    assert eng.collector.speculation.steps["partial"] > 0 and eng.collector.speculation.steps["whole"] == 0


def test_real_work_preempts_speculation_and_resumes_it():
    kw = dict(n=4, m=2, iters=5, cap=4, problems=("a", "b", "c", "d"), concurrency=3, eos_at_depth_limit=False)
    base, *_ = baseline(endless, **kw)
    fast, eng, *_ = decoupled(endless, trace=True, policy="speculative_first", **kw)
    assert candidates(fast) == candidates(base)
    assert eng.collector.speculation.steps["preempted"] > 0 and events(eng, "preempt")
    # a preempted speculative step keeps its tokens: a kept beam's child resumes from them
    assert eng.collector.speculation.steps["partial"] > 0


@pytest.mark.parametrize("scope", ["survivors", "all"])
def test_under_vllm_sampling_nothing_is_resumed_and_the_tree_holds(scope):
    """Sampling like vLLM: a preempted speculative request restarts from its path, and a
    partial step (preempted or capped) is never handed to a kept child."""
    kw = dict(n=4, m=2, iters=5, cap=4, problems=("a", "b", "c", "d"), concurrency=3, eos_at_depth_limit=False,
              sampling="stream")
    base, *_ = baseline(endless, **kw)
    fast, eng, *_ = decoupled(endless, trace=True, policy="speculative_first", scope=scope, **kw)
    assert candidates(fast) == candidates(base)
    d = eng.collector.speculation
    assert d.steps["preempted"] > 0 and d.steps["reset"] == d.steps["preempted"] and d.steps["partial"] == 0
    assert d.generated == d.used + d.wasted
    # whole steps and running requests are still adopted, and the tree holds
    kw = dict(n=8, m=4, iters=6, cap=16, concurrency=2, sampling="stream")
    short_base, *_ = baseline(short, **kw)
    short_fast, seng, *_ = decoupled(short, prm_cap=1, policy="speculative_first", scope=scope, **kw)
    assert candidates(short_fast) == candidates(short_base)
    assert seng.collector.speculation.steps["whole"] > 0 and seng.collector.speculation.used > 0
    capped, ceng, *_ = decoupled(answering, iters=5, concurrency=2, prm_cap=1, policy="speculative_first",
                                 spec_max_tokens=3, scope=scope, sampling="stream")
    assert candidates(capped) == candidates(baseline(answering, iters=5, concurrency=2, sampling="stream")[0])
    assert ceng.collector.speculation.steps["discarded"] > 0 and ceng.collector.speculation.steps["partial"] == 0


def test_kv_pressure_stops_speculation():
    base, *_ = baseline(endless, iters=4, concurrency=2)
    fast, eng, *_ = decoupled(endless, iters=4, concurrency=2, cache_blocks=4, policy="speculative_first",
                              trace=True)
    assert candidates(fast) == candidates(base)
    first_full = next(i for i, e in enumerate(eng.schedule.trace) if e[0] == "step" and e[2] >= 0.95)
    assert not [e for e in eng.schedule.trace[first_full:] if e[0] == "submit" and e[1] == "spec"]
    assert eng.collector.speculation.generated <= 2  # at most what started before the first measurement


def test_requests_queued_in_the_backend_stop_speculation():
    """A backend that keeps requests waiting (memory short) gets no speculation after two
    such steps in a row; a single waiting step (a prefill waiting for its budget) is fine."""
    cfg = cfg_for(Algorithm.beam, 4, 2, 4)
    for always in (True, False):
        gen = FakeGenerator(endless, batch_cap=8)
        orig, count = gen.step, [0]

        def step():
            deltas, st = orig()
            count[0] += 1
            waiting = 1 if always or count[0] % 3 == 0 else 0
            return deltas, StepStats(st.num_running, waiting, st.num_scheduled_tokens, st.batch_cap,
                                     st.token_cap, st.kv_usage, st.wall_s, st.tokens_per_request)

        gen.step = step
        optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy="speculative_first")
        eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys",
                              EngineOptions(concurrency=2, decoupled=decoupled_options(optim)), schedule="decoupled")
        eng.schedule.trace = []
        outs = list(eng.run(inputs(("a", "b", "c"))))
        base, *_ = baseline(endless, iters=4, concurrency=2)
        assert candidates(outs) == candidates(base)
        steps = [i for i, e in enumerate(eng.schedule.trace) if e[0] == "step"]
        late_spec = [e for e in eng.schedule.trace[steps[1]:] if e[0] == "submit" and e[1] == "spec"]
        assert bool(late_spec) is not always


# ------------------------------------------------------------------ policies


def test_each_policy_runs_and_reports():
    for name in POLICIES:
        outs, eng, gen, _ = decoupled(endless, n=8, m=4, iters=4, cap=16, problems=("a", "b", "c", "d"),
                                      policy=name, prm_cap=4, concurrency=4)
        assert len(outs) == 4
        logs = eng.step_logs()
        d = logs["decoupled"]
        assert d["policy"] == name
        assert sum(d["requests"].values()) == len(gen.calls)
        assert sum(d["tokens"].values()) == sum(o.metrics.gen_tokens for o in outs)
        assert d["eager_tokens"] > 0 and d["prm_calls"] > 0
        assert d["prm_items_mean"] <= 4 and d["prm_batch_util_mean"] is not None
        assert 0 < d["llm_batch_util_mean"] <= 1 and d["tokens_per_request_mean"] > 1
        assert set(d["tokens"]) == {"eager", "fresh", "spec"}
        s = variant_summary([], logs, None)  # the results summary reads every step log
        assert s["dec_batch_util_mean"] == d["llm_batch_util_mean"]
        for o in outs:
            m = o.metrics
            assert m.iterations == 4 and m.generator_s > 0 and m.verifier_s > 0
            assert m.scores_requested > 0 and m.gen_requests > 0 and len(m.beam_tokens) == 8
    _, eng, *_ = decoupled(endless, n=8, m=4, iters=4, cap=16, problems=("a", "b", "c"), policy="speculative_first",
                           concurrency=3)
    assert eng.step_logs()["decoupled"]["spec_tokens"] > 0


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="eager_first, speculative_first, adaptive"):
        make_fill_policy("greedy")
    assert set(FILL_POLICIES) == set(POLICIES)
    assert make_fill_policy(OptimConfig().decoupled_policy).name == "eager_first"


def test_adaptive_rule():
    pol = Adaptive(util_target=0.9, kv_threshold=0.8)

    def state(util, kv, live):
        return FillState(batch_cap=16, running=8, util=util, kv_usage=kv, live_problems=live, concurrency=4)

    assert pol.choose(state(0.5, 0.2, 2)) == EAGER_FIRST  # batch short of work, KV low
    assert pol.choose(state(0.95, 0.2, 2)) == SPECULATIVE_FIRST  # batch nearly full
    assert pol.choose(state(0.5, 0.6, 2)) == SPECULATIVE_FIRST  # one more problem: 0.6 + 0.3 > 0.8
    assert pol.choose(state(0.5, 0.5, 4)) == EAGER_FIRST  # 0.5 + 0.125 fits
    assert pol.choose(state(0.0, 0.0, 0)) == EAGER_FIRST
    pol.observe(StepStats(1, 0, 1, 16, 1 << 16, 0.0, 0.0))


def test_adaptive_follows_its_rule_in_a_run():
    # a small prefix cache drives the fake's KV usage up: starting problems looks costly
    cfg = cfg_for(Algorithm.beam, 8, 4, 4)
    gen = FakeGenerator(endless, batch_cap=8, cache_blocks=40)
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy="adaptive")
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys",
                          EngineOptions(concurrency=4, decoupled=decoupled_options(optim)), schedule="decoupled")
    seen = []
    choose = eng.schedule.fill_policy.choose

    def spy(state):
        out = choose(state)
        seen.append((state, out))
        return out

    eng.schedule.fill_policy.choose = spy
    base, *_ = baseline(endless, n=8, m=4, iters=4, problems=tuple("abcdef"), concurrency=4)
    assert candidates(list(eng.run(inputs(tuple("abcdef"))))) == candidates(base)
    outs = {out for _, out in seen}
    assert outs == {EAGER_FIRST, SPECULATIVE_FIRST}  # both, as measurements changed
    for state, out in seen:
        pressured = state.kv_usage + state.kv_per_problem > 0.8
        assert (out == SPECULATIVE_FIRST) == (pressured or state.util >= 0.9)
    assert eng.schedule.fill_policy.decisions["speculative"] == sum(o == SPECULATIVE_FIRST for _, o in seen)


# ------------------------------------------------------- continuous batching


def test_continuous_problem_batching_keeps_the_batch_full():
    cfg = cfg_for(Algorithm.beam, 4, 2, 3)
    gen = FakeGenerator(endless, batch_cap=8)
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy="eager_first")
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys",
                          EngineOptions(concurrency=4, eos_at_depth_limit=False, decoupled=decoupled_options(optim)), schedule="decoupled")
    seen = []
    orig = gen.step

    def spy():
        backlog = eng.schedule.backlog()
        deltas, stats = orig()
        seen.append((backlog, stats))
        return deltas, stats

    gen.step = spy
    outs = list(eng.run(inputs(("a", "b", "c", "d", "e", "f"))))
    assert len(outs) == 6
    busy = [s for b, s in seen if b]
    assert busy and all(s.num_running == 8 for s in busy)  # full whenever work remained
    base, beng, _ = baseline(endless, n=4, m=2, iters=3, problems=("a", "b", "c", "d", "e", "f"),
                             concurrency=4, eos_at_depth_limit=False)
    assert candidates(outs) == candidates(base)
    util = eng.step_logs()["decoupled"]["llm_batch_util_mean"]
    assert util > beng.collector.logs["generator"].summary()["batch_util_mean"]
    assert eng.collector.logs["generator"].steps < beng.collector.logs["generator"].steps


def test_outcomes_stream_as_problems_finish():
    cfg = cfg_for(Algorithm.beam, 4, 2, 3)
    gen = FakeGenerator(endless, batch_cap=8)
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys",
                          EngineOptions(concurrency=1, decoupled=decoupled_options(OptimConfig(engine=EngineKind.decoupled))), schedule="decoupled")
    it = eng.run(inputs(("a", "b")))
    first = next(it)
    assert first.problem.id == "a" and eng.schedule.inflight.queue  # b not started yet with concurrency 1
    assert [o.problem.id for o in it] == ["b"]


def test_the_memory_policy_sees_the_decoupled_schedules_beams():
    """M is the engine's policy whatever the schedule: the decoupled one shows it the
    committed beams of every problem in flight after each admission and selection, and
    the batch cap it sets is the one the schedule fills to."""
    cfg = cfg_for(Algorithm.beam, 4, 2, 3)
    gen = FakeGenerator(endless, batch_cap=8)
    seen, running = [], []

    def plan(beams):
        seen.append(len(beams))
        gen.set_limits(batch_cap=4 if len(beams) > 4 else 8)

    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(concurrency=2),
                 schedule="decoupled", replan=plan)
    orig = gen.step

    def step():
        deltas, stats = orig()
        running.append((stats.num_running, gen.batch_cap))
        return deltas, stats

    gen.step = step
    outs = list(eng.run(inputs(("a", "b", "c"))))
    assert len(outs) == 3 and seen and max(seen) == 8  # two problems of 4 beams in flight
    assert all(n <= cap for n, cap in running) and any(cap == 4 for _, cap in running)
    base, *_ = baseline(endless, n=4, m=2, iters=3, problems=("a", "b", "c"), concurrency=2)
    assert candidates(outs) == candidates(base)  # M changes how it runs, not what it decides


def test_speculation_guard_follows_the_cost_model_break_even():
    """Speculation pays while hit rate x (b + a / B) > b: on a GPU-like model (b = 0) any
    hit rate pays; on a CPU-like one (b = 7% of a, 16 real requests a step) it takes more
    than half; before enough tokens settled, or before a fit, it is not judged."""
    from tts.engine.speculation.guard import MIN_EVIDENCE, PROBE_EVERY, PROBE_FOR, SpeculationGuard
    from tts.metrics.cost_model import CostModel
    from tts.metrics.measures import SpeculationLog

    def guard(a, b, used, wasted):
        stats = SpeculationLog(used=used, wasted=wasted)
        g = SpeculationGuard(stats, CostModel(a, b, 0.0, steps=100, r2=1.0))
        return g, stats

    step = StepStats(16, 0, 16, 64, 1 << 16, 0.0, 0.05)
    g, _ = guard(0.05, 0.0, 10, 1000)
    g.observe(step, 16)
    assert g.breakeven() == 0.0 and g.paying()  # GPU-like: free slots cost nothing
    g, stats = guard(0.05, 0.0034, 400, 600)
    g.observe(step, 16)
    assert g.breakeven() == pytest.approx(0.0034 / (0.0034 + 0.05 / 16))
    assert not g.paying() and not g.allows()  # 0.4 < 0.52
    for _ in range(PROBE_EVERY - 1):
        g.observe(step, 16)
    assert g.allows() and g.off_steps == PROBE_EVERY  # a probe measures again
    for _ in range(PROBE_FOR):
        g.observe(step, 16)
    assert not g.allows()
    stats.used = 700  # it pays now
    g.observe(step, 16)
    assert g.paying() and g.allows()
    g, _ = guard(0.05, 0.0034, 10, MIN_EVIDENCE - 11)
    g.observe(step, 16)
    assert g.hit_rate() is None and g.allows()  # too little evidence to judge


def test_guarded_speculation_stops_when_it_does_not_pay_and_keeps_the_answers():
    """With a cost model under which no hit rate pays (a = 0), the guard stops new
    speculation once enough of it settled; the answers stay the baseline's. (The fake
    backend's own step times fit nothing, r2 near 0: unjudged, as in every other test.)"""
    from tts.engine.speculation.guard import SpeculationGuard
    from tts.metrics.cost_model import CostModel

    kw = dict(n=8, m=4, iters=6, cap=16, policy="speculative_first", concurrency=2, scope="all",
              problems=("a", "b", "c", "d"))
    free, feng, *_ = decoupled(endless, **kw)
    cfg = cfg_for(Algorithm.beam, 8, 4, 6)
    gen = FakeGenerator(endless, batch_cap=16)
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy="speculative_first",
                        decoupled_spec_scope="all")
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(concurrency=2, decoupled=decoupled_options(optim)),
                 schedule="decoupled")
    stats = eng.collector.speculation
    evidence = 32
    eng.schedule.speculation.guard = SpeculationGuard(stats, CostModel(0.0, 0.004, 0.0, steps=100, r2=1.0), evidence)
    outs = list(eng.run(inputs(("a", "b", "c", "d"))))
    assert candidates(outs) == candidates(free)
    unguarded = feng.collector.speculation.generated
    assert unguarded > 4 * evidence  # plenty to judge on
    assert evidence <= stats.used + stats.wasted and stats.generated < unguarded
    logs = eng.step_logs()["speculation"]
    assert logs["spec_guard_off_steps"] > 0 and logs["spec_breakeven"] == 1.0
