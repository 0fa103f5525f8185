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
from tts.token_hash import extend_hash
from tts.trace.format import TRACE, read_trace
from tts.trace.recorder import TraceRecorder

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


class Seen:
    """What the fake backends were asked, as a run's trace has it: the trace itself (a
    `TraceRecorder` on both backends, in `folder`: every generation, with its seed, prompt
    key, tokens, how it ended and whether it was sent as speculation), and, from the
    backend observers it records through, the requests sent and the generator steps (their
    statistics) in the order they came."""

    def __init__(self, gen, ver, folder):
        self.recorder = TraceRecorder(folder / TRACE, {})
        self.recorder.attach("v", gen, ver)
        self.order = []  # ("sent", GenRequest) or ("step", StepStats)
        gen.add_request_observer(lambda r: self.order.append(("sent", r)), lambda ids: None)
        gen.add_step_observer(lambda deltas, st, wall_s: self.order.append(("step", st)))

    def trace(self):
        self.recorder.flush()
        return read_trace(self.recorder.path)

    def speculative(self):
        """The speculative generations, each as (seed, prompt key, generation)."""
        return [(seed, h, g) for (seed, h), gens in self.trace().sent.items() for g in gens if g.speculative]


def decoupled(script, algo=Algorithm.beam, n=4, m=2, iters=5, problems=("a", "b", "c"), cap=8, policy="eager_first",
              prm_cap=0, verifier=None, search_kw=None, cache_blocks=1 << 20, seen=None, no_verifier=False,
              scope="survivors", sampling="context", **opts):
    """The decoupled engine's outcomes, the engine and its backends; with `seen` (a folder),
    what the backends were asked too (`Seen`)."""
    cfg = cfg_for(algo, n, m, iters, **(search_kw or {}))
    gen = FakeGenerator(script, batch_cap=cap, cache_blocks=cache_blocks, sampling=sampling)
    ver = None if no_verifier else (verifier or Recorder())
    optim = OptimConfig(engine=EngineKind.decoupled, decoupled_policy=policy, verifier_batch_size=prm_cap,
                        decoupled_spec_scope=scope)
    eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts, decoupled=decoupled_options(optim)), schedule="decoupled")
    watch = Seen(gen, ver, seen) if seen is not None else None
    outs = list(eng.run(inputs(problems)))
    return (outs, eng, gen, ver) if watch is None else (outs, eng, gen, ver, watch)


def candidates(outs):
    return sorted((o.problem.id, [(b.text, b.scores) for b in o.candidates]) for o in outs)


def scored_in_order(calls):
    """Each verifier request scores one step, the shallowest its path has unscored: every
    earlier step of the path was scored in an earlier call. Returns the requests that left
    a later step of their path unscored (a beam scored step by step)."""
    scored, step_by_step = set(), []
    for call in calls:
        for req in call:
            (i,) = req.indices  # one step per beam per call
            assert all((req.problem, req.steps[: j + 1]) in scored for j in range(i)), (req.problem, i)
            if i < len(req.steps) - 1:
                step_by_step.append(req)
        scored |= {(req.problem, req.steps[: req.indices[0] + 1]) for req in call}
    return step_by_step


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
        spec = {(p.id, s.beam.step_texts + (gen.decode(s.tokens),))  # the speculative steps held now
                for p in eng.schedule.inflight.live for s in p.spec_table.values() if s.tokens}
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
    _, eng, _, ver = decoupled(endless, Algorithm.varying_granularity, iters=6, prm_cap=4,
                               search_kw={"verify_every": 2}, policy="speculative_first", concurrency=2)
    assert scored_in_order(ver.calls)  # some beam was scored step by step
    assert all(len(reqs) <= 4 for reqs in ver.calls)
    # every item of the PRM's calls reached the verifier (unique steps: no cache hits)
    assert sum(len(reqs) for reqs in ver.calls) == sum(eng.collector.work.items["select"]) > 0
    assert len(ver.scored) == len(set(ver.scored))  # no step scored twice


# --------------------------------------------------------------- speculation


def test_pruned_beams_speculation_is_dropped_and_counted(monkeypatch):
    """Which speculative steps are dropped, and the frontiers selections make, are the
    schedule's decisions (no trace holds them): the test watches the mechanism's drop and
    the selection."""
    from tts.engine.inflight import Inflight
    from tts.engine.speculation import steps as spec_steps

    drops, frontiers = [], []
    real_drop, real_select = spec_steps.drop, Inflight.select

    def drop(runner, dropped):
        drops.extend((s.beam.parent, s.beam.uid, s.generated) for s in dropped)
        return real_drop(runner, dropped)

    def select(self, problem):
        parents = real_select(self, problem)
        frontiers.append([(b.uid, b.parent) for b in problem.search.frontier])
        return parents

    monkeypatch.setattr(spec_steps, "drop", drop)
    monkeypatch.setattr(Inflight, "select", select)
    outs, eng, *_ = decoupled(short, n=8, m=4, iters=6, cap=16, prm_cap=2, policy="speculative_first", concurrency=2)
    assert drops and sum(t for *_, t in drops) > 0
    frontier_uids = {uid for f in frontiers for uid, _ in f}
    frontier_parents = {parent for f in frontiers for _, parent in f}
    for parent, shadow, _ in drops:
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


def test_kept_beams_speculative_step_is_reused_without_a_request(tmp_path):
    base, _, bgen = baseline(short, n=8, m=4, iters=6, cap=16, concurrency=2)
    fast, eng, gen, _, seen = decoupled(short, n=8, m=4, iters=6, cap=16, seen=tmp_path, prm_cap=1,
                                        policy="speculative_first", concurrency=2)
    assert candidates(fast) == candidates(base)
    assert eng.collector.speculation.steps["whole"] > 0
    # no token is generated twice: a kept child whose step was speculated sends no request
    # of its own for it (its seed on its parent's path), whichever way it adopted the step
    trace = seen.trace()
    speculated = [key for key, gens in trace.sent.items() if any(g.speculative and g.tokens for g in gens)]
    assert speculated and all(all(g.speculative for g in trace.sent[key]) for key in speculated)
    d = eng.collector.work
    assert len(gen.calls) == sum(d.requests.values())  # every request the engine counted
    real = d.requests["fresh"] + d.requests["eager"]
    spec = eng.collector.speculation
    assert real == len(bgen.calls) - spec.steps["whole"] - spec.steps["promoted"]
    assert sum(o.metrics.spec_used for o in fast) == spec.used > 0


def test_survivor_scope_speculates_the_kept_beams_children(tmp_path):
    kw = dict(n=8, m=4, iters=6, cap=16, prm_cap=2, policy="speculative_first", concurrency=2)
    runs = {}
    for scope in ("survivors", "all"):
        (tmp_path / scope).mkdir()
        runs[scope] = decoupled(short, scope=scope, seen=tmp_path / scope, **kw)
    others = {}  # by scope: the speculative steps of a child other than child 0, from the trace
    for scope, (*_, seen) in runs.items():
        spec = seen.speculative()
        # a step's seed on the path it made: child 0's seed and path (child 0 keeps its
        # parent's seed); a speculative request resumed from its own tokens is no new step
        made = {(seed, extend_hash(h, g.tokens)) for (seed, h), gens in seen.trace().sent.items() for g in gens}
        resumed = {(seed, extend_hash(h, g.tokens)) for seed, h, g in spec if g.tokens}
        others[scope] = [(seed, h) for seed, h, _ in spec if (seed, h) not in resumed | made]
    assert not others["all"]  # child 0 only
    assert others["survivors"]  # other children of the beams likely kept
    surv, every = (runs[scope][1].collector.speculation for scope in ("survivors", "all"))
    assert surv.used > every.used
    assert surv.used / surv.generated > every.used / every.generated


def test_partial_speculation_under_a_token_cap_keeps_the_result():
    base, *_ = baseline(answering, iters=5, concurrency=2)
    fast, eng, *_ = decoupled(answering, iters=5, concurrency=2, prm_cap=1, policy="speculative_first",
                              spec_max_tokens=3)
    assert candidates(fast) == candidates(base)
    assert eng.collector.speculation.steps["partial"] > 0 and eng.collector.speculation.steps["whole"] == 0


def test_real_work_preempts_speculation_and_resumes_it(tmp_path):
    kw = dict(n=4, m=2, iters=5, cap=4, problems=("a", "b", "c", "d"), concurrency=3, eos_at_depth_limit=False)
    base, *_ = baseline(endless, **kw)
    fast, eng, _, _, seen = decoupled(endless, seen=tmp_path, policy="speculative_first", **kw)
    assert candidates(fast) == candidates(base)
    assert eng.collector.speculation.steps["preempted"] > 0
    # a preempted speculative step keeps its tokens: a kept beam's child resumes from them
    assert eng.collector.speculation.steps["partial"] > 0
    # in the trace: a speculative request stopped part-way, and a request (its own again,
    # or its kept child's) with the same seed on its path extended by those tokens
    sent = set(seen.trace().sent)
    assert [(seed, h) for seed, h, g in seen.speculative()
            if g.finish == "aborted" and g.tokens and (seed, extend_hash(h, g.tokens)) in sent]


@pytest.mark.parametrize("scope", ["survivors", "all"])
def test_under_vllm_sampling_nothing_is_resumed_and_the_tree_holds(scope):
    """Sampling like vLLM: a preempted speculative request restarts from its path, and a
    partial step (preempted or capped) is never handed to a kept child."""
    kw = dict(n=4, m=2, iters=5, cap=4, problems=("a", "b", "c", "d"), concurrency=3, eos_at_depth_limit=False,
              sampling="stream")
    base, *_ = baseline(endless, **kw)
    fast, eng, *_ = decoupled(endless, policy="speculative_first", scope=scope, **kw)
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


def test_kv_pressure_stops_speculation(tmp_path):
    base, *_ = baseline(endless, iters=4, concurrency=2)
    fast, eng, _, _, seen = decoupled(endless, iters=4, concurrency=2, cache_blocks=4, policy="speculative_first",
                                      seen=tmp_path)
    assert candidates(fast) == candidates(base)
    first_full = next(i for i, (kind, st) in enumerate(seen.order) if kind == "step" and st.kv_usage >= 0.95)
    assert not [r for kind, r in seen.order[first_full:] if kind == "sent" and r.speculative]
    assert eng.collector.speculation.generated <= 2  # at most what started before the first measurement


def test_requests_queued_in_the_backend_stop_speculation(tmp_path):
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
        ver = FakeVerifier()
        eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys",
                     EngineOptions(concurrency=2, decoupled=decoupled_options(optim)), schedule="decoupled")
        (tmp_path / str(always)).mkdir()
        seen = Seen(gen, ver, tmp_path / str(always))
        outs = list(eng.run(inputs(("a", "b", "c"))))
        base, *_ = baseline(endless, iters=4, concurrency=2)
        assert candidates(outs) == candidates(base)
        steps = [i for i, (kind, _) in enumerate(seen.order) if kind == "step"]
        late_spec = [r for kind, r in seen.order[steps[1]:] if kind == "sent" and r.speculative]
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
