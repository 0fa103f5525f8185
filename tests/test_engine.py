"""The barrier schedule on the deterministic fake backend."""

import random

import pytest

from tts.backends.fake import FakeGenerator, FakeVerifier, answering_script, endless_script
from tts.config.enums import Algorithm
from tts.config.schema import SearchConfig
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.engine.ordering import PrefixAware, greedy_order
from tts.engine.options import VerifierShape
from tts.engine.speculation.policy import inherit_speculation, spec_priorities, truncate_len
from tts.search import make_policy
from tts.search.tree import Beam, BeamState


endless, answering = endless_script, answering_script


def run(script, algo=Algorithm.beam, n=4, m=2, iters=3, problems=("p1",), cap=64, verifier=None,
        cache_blocks=1 << 20, sampling="context", **opts):
    cfg = SearchConfig(algorithm=algo, n=n, beam_width=m, max_iterations=iters)
    gen = FakeGenerator(script, batch_cap=cap, cache_blocks=cache_blocks, sampling=sampling)
    ver = verifier or FakeVerifier()
    eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts))
    outs = list(eng.run([ProblemInput(p, f"problem {p}") for p in problems]))
    return outs, eng, gen, ver


def test_score_cache_hits_counted_exactly():
    outs, eng, _, ver = run(endless, iters=3, eos_at_depth_limit=False)
    # iteration k scores all k+1 steps of 4 beams; only the newest step is new.
    assert len(ver.scored) == 4 * 3
    assert outs[0].metrics.score_cache_hits == 4 * (0 + 1 + 2)
    assert outs[0].metrics.scores_requested == 4 * (1 + 2 + 3)
    outs, _, _, ver = run(endless, iters=3, eos_at_depth_limit=False, score_cache=False)
    assert len(ver.scored) == 4 * (1 + 2 + 3)  # search-and-learn rescored every step
    assert outs[0].metrics.score_cache_hits == 0


def test_the_step_is_a_plan_the_backend_sees_with_the_step():
    """`next()` returns a generator step with the changes to the batch the schedule made
    (the requests it sends and stops, in order), and the generator sees them only when the
    step runs; a change left out of a step's plan is an error."""
    from tts.engine.messages import Generate

    cfg = SearchConfig(n=4, beam_width=2, max_iterations=3)
    gen = FakeGenerator(endless, batch_cap=8)
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(speculative=True))
    eng.schedule.add([ProblemInput("a", "problem a")])
    first = eng.schedule.next()
    assert isinstance(first, Generate) and len(first.plan.sent()) == 4 and not first.plan.stopped()
    assert gen.num_unfinished() == 0  # nothing sent yet
    eng.schedule.generated(*eng.runner.step(first.plan))
    assert gen.calls == [r.request_id for r in first.plan.sent()]
    stopping = None
    while stopping is None:  # until a step's plan stops a request
        work = eng.schedule.next()
        if isinstance(work, Generate) and work.plan.stopped():
            stopping = work
        elif isinstance(work, Generate):
            eng.schedule.generated(*eng.runner.step(work.plan))
        else:
            eng.schedule.scored(work, eng.runner.score(work.items, lambda items: items, work.charge))
    before = gen.num_unfinished()  # the requests it stops still run until the plan does
    eng.runner.run(stopping.plan)
    assert gen.num_unfinished() == before - len(stopping.plan.stopped()) + len(stopping.plan.sent())
    eng.runner.stop([next(iter(eng.runner.requests.values()))])  # a change after the plan was handed back
    with pytest.raises(RuntimeError, match="left out of the step's plan"):
        eng.runner.step(Generate().plan)
    eng.runner.flush()


def test_problem_record_fields_and_invariants():
    outs, *_ = run(answering, iters=4)
    o = outs[0]
    assert len(o.candidates) == 4
    for b in o.candidates:
        assert b.text == "".join(s.text for s in b.steps)
        assert b.num_tokens == sum(len(s.token_ids) for s in b.steps)
        assert all(s is not None and 0 <= s <= 1 for s in b.scores)
    m = o.metrics.to_dict()
    assert m["iterations"] >= 1 and m["precise_goodput"] > 0 and len(m["beam_tokens"]) == 4


def test_continuous_problem_batching_keeps_batch_at_cap():
    outs, eng, gen, _ = run(endless, n=4, m=2, iters=2, problems=("a", "b", "c"), cap=8, concurrency=3)
    assert len(outs) == 3
    assert eng.collector.logs["generator"].steps > 0
    assert eng.collector.logs["generator"].util_hist[-1] > 0  # some steps ran at the full cap of 8


def test_continuous_batching_step_stats_full_while_waiting():
    gen = FakeGenerator(endless, batch_cap=8)
    cfg = SearchConfig(n=4, beam_width=2, max_iterations=2)
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(concurrency=3))
    seen = []
    gen.add_step_observer(lambda deltas, stats, wall_s: seen.append(stats))
    list(eng.run([ProblemInput(p, p) for p in ("a", "b", "c")]))
    waiting_steps = [s for s in seen if s.num_waiting > 0]
    assert waiting_steps and all(s.num_running == 8 for s in waiting_steps)
    assert max(s.num_running for s in seen) == 8


def test_concurrency_one_runs_problems_in_turn():
    outs, *_ = run(answering, problems=("a", "b"), concurrency=1)
    assert [o.problem.id for o in outs] == ["a", "b"]


def test_fresh_cache_per_problem_makes_a_problem_independent_of_the_one_before():
    """A problem started on empty prefix caches records what it records when run alone,
    cached tokens included; without the reset it inherits the one before's prefixes."""
    def metrics(fresh, problems):
        outs, *_ = run(answering, problems=problems, concurrency=1, fresh_cache_per_problem=fresh)
        o = outs[-1]
        return o.metrics.gen_cached_tokens, sorted(b.text for b in o.candidates)

    alone = metrics(True, ("b",))
    assert metrics(True, ("a", "b")) == alone
    after = metrics(False, ("a", "b"))
    assert after[1] == alone[1] and after[0] > alone[0]  # same tree, the system prompt was cached


def candidates(outs):
    return [[(b.text, b.scores) for b in o.candidates] for o in outs]


def test_speculation_lookahead_prefix_order_keep_the_result():
    """With duplicates keeping no speculative tokens (R=0), S + lookahead + P must
    reproduce the baseline's tree exactly: the original child's speculative tokens are
    what it would have generated, and lookahead scores equal fresh ones."""
    for algo in (Algorithm.beam, Algorithm.dvts, Algorithm.dynamic_branching):
        base, *_ = run(answering, algo=algo, n=4, m=2, iters=8, problems=("a", "b"))
        fast, eng, _, _ = run(answering, algo=algo, n=4, m=2, iters=8, problems=("a", "b"), speculative=True,
                              lookahead=True, ordering="prefix_aware", spec_truncate_ratio=0.0,
                              spec_truncate_std=0.0)
        assert candidates(fast) == candidates(base), algo
        assert sum(o.metrics.spec_used for o in fast) > 0
        assert eng.cache.lookahead_hits > 0
        # each problem's lookahead hits are its own, and never more than it scored ahead
        used = {o.problem.id: o.metrics.lookahead_used for o in fast}
        assert sum(used.values()) == eng.cache.lookahead_hits
        assert all(o.metrics.lookahead_used <= o.metrics.lookahead_scored for o in fast)
        assert not eng.cache.lookahead_hits_by_problem  # handed to the metrics when each finished


class _CallCounter(FakeVerifier):
    """A fake verifier that counts its calls."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls = 0

    def _score(self, requests):
        self.calls += 1
        return super()._score(requests)


def test_lookahead_kept_scope_scores_ahead_only_for_kept_beams():
    """Scope `kept`: the current steps are scored first, then lookahead only for the beams
    selection keeps. Same tree as scope `all`, every lookahead score of beam search is read
    back (no duplicate filtering on these texts), and fewer are made."""
    common = dict(n=8, m=4, iters=5, problems=("a", "d"), speculative=True, lookahead=True,
                  ordering="prefix_aware", spec_truncate_ratio=0.0, spec_truncate_std=0.0)
    base, *_ = run(answering, n=8, m=4, iters=5, problems=("a", "d"))
    every, e_eng, _, e_ver = run(answering, lookahead_scope="all", **common)
    kept, k_eng, _, k_ver = run(answering, lookahead_scope="kept", **common)
    assert candidates(every) == candidates(kept) == candidates(base)
    assert not e_eng.schedule.lookahead.kept and k_eng.schedule.lookahead.kept
    assert 0 < k_eng.cache.lookahead_stored < e_eng.cache.lookahead_stored
    assert k_eng.cache.lookahead_hits == e_eng.cache.lookahead_hits > 0  # the same scores used
    assert k_eng.cache.lookahead_hits == k_eng.cache.lookahead_stored  # every one read back
    assert len(k_ver.scored) < len(e_ver.scored)
    for o in kept:  # counted per problem as before
        assert 0 < o.metrics.lookahead_used == o.metrics.lookahead_scored


@pytest.mark.parametrize("script,iters,n,m", [(endless, 5, 8, 4), (answering, 4, 8, 4), (answering, 5, 4, 2)])
def test_no_lookahead_before_an_iteration_that_samples_to_eos(script, iters, n, m):
    """Before the last iteration, which samples to EOS, a beam's next step is the rest of
    its path, not the step its speculative tokens hold: no score is made ahead for it, so
    every kept beam's lookahead score is read back (each of these cases made one unread)."""
    outs, eng, _, _ = run(script, n=n, m=m, iters=iters, problems=("a", "b"), speculative=True, lookahead=True,
                          lookahead_scope="kept", spec_truncate_ratio=0.0, spec_truncate_std=0.0,
                          eos_at_depth_limit=True)
    assert eng.cache.lookahead_hits == eng.cache.lookahead_stored
    assert sum(o.metrics.lookahead_scored for o in outs) == eng.cache.lookahead_stored


def test_lookahead_auto_is_off_for_a_per_score_verifier_and_all_for_a_path_prm():
    """Scope `auto`: with a verifier that asks once per score, `kept` would score the same
    requests one call early; auto scores nothing ahead, computes exactly the scores `kept`
    computes, in fewer calls, on the same tree. With a whole-path PRM auto is `all`."""
    common = dict(n=8, m=4, iters=5, problems=("a", "b"), speculative=True, lookahead=True,
                  ordering="prefix_aware", spec_truncate_ratio=0.0, spec_truncate_std=0.0)
    kept, k_eng, _, k_ver = run(answering, lookahead_scope="kept",
                                verifier=_CallCounter(request_per_score=True), **common)
    auto, a_eng, _, a_ver = run(answering, verifier=_CallCounter(request_per_score=True), **common)
    assert candidates(auto) == candidates(kept)
    assert not a_eng.schedule.lookahead.on and a_eng.cache.lookahead_stored == 0
    assert sorted(a_ver.scored) == sorted(k_ver.scored)  # the same scores, none extra
    assert a_ver.calls < k_ver.calls  # without the second call of every iteration
    every, e_eng, _, e_ver = run(answering, lookahead_scope="all", **common)
    path, p_eng, _, p_ver = run(answering, **common)  # the fake PRM reads a whole path
    assert p_eng.schedule.lookahead.on and not p_eng.schedule.lookahead.kept
    assert p_ver.scored == e_ver.scored


def test_the_engine_decides_for_the_verifier_its_options_name():
    """`verifier_shape` (a run recorded for a card: its pair's PRM) decides lookahead's
    `auto` scope, whatever verifier scores here: a per-score judge scoring for a whole-path
    PRM looks ahead as the PRM would, and the judge computes the scores `all` asks for."""
    common = dict(n=8, m=4, iters=5, problems=("a", "b"), speculative=True, lookahead=True,
                  ordering="prefix_aware", spec_truncate_ratio=0.0, spec_truncate_std=0.0)
    every, e_eng, _, e_ver = run(answering, lookahead_scope="all", **common)
    judge = _CallCounter(request_per_score=True)
    card, c_eng, _, c_ver = run(answering, verifier=judge, verifier_shape=VerifierShape(False, False), **common)
    assert c_eng.schedule.lookahead.on and not c_eng.schedule.lookahead.kept
    assert c_eng.cache.lookahead_stored == e_eng.cache.lookahead_stored > 0
    assert c_ver.scored == e_ver.scored and candidates(card) == candidates(every)
    _, off, _, _ = run(answering, verifier_shape=VerifierShape(True, True), **common)  # the other way round
    assert not off.schedule.lookahead.on


def test_lookahead_scope_rejects_unknown_names():
    with pytest.raises(ValueError, match="lookahead_scope: 'some'; valid choices: auto, all, kept"):
        run(answering, speculative=True, lookahead=True, lookahead_scope="some")


def test_speculation_hides_stragglers():
    """Duplicates keeping all speculative tokens (R=1) start with whole steps in hand:
    later iterations need fewer generator steps, and the used tokens are counted."""
    base, beng, *_ = run(endless, n=8, m=4, iters=4, problems=("a",), eos_at_depth_limit=False)
    fast, feng, *_ = run(endless, n=8, m=4, iters=4, problems=("a",), eos_at_depth_limit=False, speculative=True,
                         spec_truncate_ratio=1.0, spec_truncate_std=0.0)
    assert feng.collector.logs["generator"].steps < beng.collector.logs["generator"].steps
    m = fast[0].metrics
    assert 0 < m.spec_used <= m.spec_generated


@pytest.mark.parametrize("branches", [False, True])
def test_spec_prune_stops_only_the_speculation_of_beams_selection_prunes(monkeypatch, branches):
    """Speculation pruning: once the real requests still decoding are down to N/M, the
    finished steps are scored early and every beam that N/M others outscore stops
    speculating. Each such beam is pruned by selection; the tree is the one without
    pruning (run-on with R = 0, or branches, and slots to spare: no other beam's speculation changes), fewer
    speculative tokens are generated, and no score is computed twice."""
    from tts.engine.barrier_generation import IterationGeneration

    stopped, iteration = [], []
    original, begin = IterationGeneration.stop_speculating, IterationGeneration.begin

    def spy(self, beams):
        stopped.extend(r.beam for r in iteration if r.beam.uid in beams)
        return original(self, beams)

    def spy_begin(self, requests, *problems):
        iteration[:] = requests
        return begin(self, requests, *problems)

    monkeypatch.setattr(IterationGeneration, "stop_speculating", spy)
    monkeypatch.setattr(IterationGeneration, "begin", spy_begin)
    common = dict(n=8, m=4, iters=5, problems=("a", "b"), speculative=True, ordering="prefix_aware",
                  spec_truncate_ratio=0.0, spec_truncate_std=0.0, spec_rule="branches" if branches else "auto")
    base, *_ = run(answering, n=8, m=4, iters=5, problems=("a", "b"))
    plain, _, _, p_ver = run(answering, **common)
    pruned, eng, _, ver = run(answering, spec_prune=True, **common)
    assert candidates(pruned) == candidates(plain) == candidates(base)
    assert stopped and all(b.state is BeamState.PRUNED for b in stopped)
    assert sum(o.metrics.spec_pruned_beams for o in pruned) == len(stopped)
    assert sum(o.metrics.spec_pruned_requests for o in pruned) > 0
    assert sum(o.metrics.spec_generated for o in pruned) < sum(o.metrics.spec_generated for o in plain)
    assert len(set(ver.scored)) == len(ver.scored) and sorted(ver.scored) == sorted(p_ver.scored)


def test_spec_prune_needs_speculation_and_the_barrier():
    from tts.config.enums import EngineKind
    from tts.config.schema import OptimConfig

    with pytest.raises(ValueError, match="optim.spec_prune: needs optim.speculative=true and engine=flash"):
        OptimConfig(engine=EngineKind.flash, spec_prune=True)


def test_spec_priorities_bins():
    # B = 2 bins: the top half may spawn 2 branches, the bottom half 1
    assert spec_priorities([0.9, 0.1, 0.5, 0.3], 2) == [2, 1, 2, 1]
    assert spec_priorities([None, None], 4) == [3, 3]
    assert spec_priorities([0.5, 0.5, 0.1], 3) == [3, 3, 1]


def test_duplicate_truncate_rule_exact():
    parent = Beam("p", (1,), seed=5, spec_tokens=tuple(range(20)))
    orig, dup1, dup2 = parent.fork(5), parent.fork(6), parent.fork(7)
    rng = random.Random(0)
    expect_rng = random.Random(0)
    k1 = truncate_len(20, 0.85, 0.1, expect_rng)
    k2 = truncate_len(20, 0.85, 0.1, expect_rng)
    full, trunc = inherit_speculation([orig, dup1, dup2], {parent.uid: parent}, 0.85, 0.1, rng)
    assert orig.spec_tokens == tuple(range(20)) and full == 20
    assert dup1.spec_tokens == tuple(range(k1)) and dup2.spec_tokens == tuple(range(k2))
    assert trunc == k1 + k2
    assert truncate_len(20, 0.85, 0.0, rng) == 17
    assert truncate_len(20, 1.7, 0.0, rng) == 20  # clipped to [0, 1]


def test_a_duplicate_always_samples_some_of_its_own_step():
    """The paper's rule keeps the whole step on a draw near 1 (for 10 tokens, any draw at or
    above 0.95), and the duplicate is child 0's clone; with `own_min` it samples at least
    that many tokens of its own, whatever the draw."""
    rng = random.Random(0)
    assert truncate_len(10, 1.0, 0.0, rng) == 10  # own_min 0: Algorithm 1 as written, a clone
    assert truncate_len(10, 1.0, 0.0, rng, own_min=4) == 6
    assert truncate_len(10, 0.5, 0.0, rng, own_min=4) == 5  # the draw already leaves enough
    assert truncate_len(3, 0.85, 0.0, rng, own_min=4) == 0  # a step shorter than that: all its own
    draws = [truncate_len(10, 0.85, 0.1, rng, own_min=4) for _ in range(2000)]
    assert max(draws) == 6 and min(draws) < 6
    parent = Beam("p", (1,), seed=5, spec_tokens=tuple(range(10)))
    orig, dup = parent.fork(5), parent.fork(6)
    inherit_speculation([orig, dup], {parent.uid: parent}, 1.0, 0.0, rng, step_lens={parent.uid: 10}, own_min=4)
    assert orig.spec_tokens == tuple(range(10)) and dup.spec_tokens == tuple(range(6))


def test_duplicates_keep_a_fraction_of_the_next_step_not_of_all_the_run_on():
    """Run-on tokens may hold more than the next step; a duplicate keeps a fraction of that
    step only, so it diverges within it instead of starting as a copy of child 0's step."""
    parent = Beam("p", (1,), seed=5, spec_tokens=tuple(range(40)))
    orig, dup = parent.fork(5), parent.fork(6)
    rng, expect = random.Random(3), random.Random(3)
    k = truncate_len(12, 0.85, 0.1, expect)
    full, trunc = inherit_speculation([orig, dup], {parent.uid: parent}, 0.85, 0.1, rng, step_lens={parent.uid: 12})
    assert orig.spec_tokens == tuple(range(40)) and dup.spec_tokens == tuple(range(k)) and k < 12
    assert (full, trunc) == (40, k)
    other = Beam("q", (1,), seed=5, spec_tokens=tuple(range(8)))  # the step is longer than the tokens
    dup2 = other.fork(9)
    inherit_speculation([dup2], {other.uid: other}, 1.0, 0.0, rng, step_lens={other.uid: 30})
    assert dup2.spec_tokens == tuple(range(8))


def test_engine_cuts_duplicates_at_the_speculative_next_step(monkeypatch):
    """In the engine, the step a duplicate's truncation is drawn from is the parent's
    speculative next step (up to and including its "\\n\\n"), not all its run-on: with
    R = 1 a duplicate keeps exactly that step, and child 0 keeps everything."""
    from tts.backends.fake import decode
    from tts.engine.speculation import runon as spec_runon

    seen = []
    real = spec_runon.inherit_speculation

    def spy(children, parents, ratio, std, rng, step_lens=None, own_min=0):
        out = real(children, parents, ratio, std, rng, step_lens, own_min)
        seen.append(({uid: p.spec_tokens for uid, p in parents.items()}, dict(step_lens or {}),
                     [(c.parent, c.seed == parents[c.parent].seed, c.spec_tokens) for c in children]))
        return out

    monkeypatch.setattr(spec_runon, "inherit_speculation", spy)
    run(endless, n=8, m=2, iters=4, eos_at_depth_limit=False, speculative=True,
        spec_truncate_ratio=1.0, spec_truncate_std=0.0, spec_own_min_tokens=0)  # the paper's rule
    past_the_step = 0
    for spec_of, step_lens, children in seen:
        for parent, original, got in children:
            spec = spec_of[parent]
            if not spec:
                continue
            text = decode(spec)
            step = text.index("\n\n") + 2 if "\n\n" in text else len(text)
            assert step_lens[parent] == step
            assert got == (spec if original else spec[:step])
            past_the_step += len(spec) > step and not original
    assert past_the_step > 0  # run-on went past the next step, and duplicates were cut inside it


def test_prefix_aware_order_is_the_greedy_order():
    root = Beam("p", (1, 2, 3), 1)
    a, b = root.fork(2), root.fork(3)
    a.prompt_ids, b.prompt_ids = (1, 2, 3, 10), (1, 2, 3, 20)
    kids = [a.fork(11), b.fork(21), a.fork(12), b.fork(22), a.fork(13)]
    for i, k in enumerate(kids):
        k.prompt_ids = k.prompt_ids + (100 + i,)
    ordered = PrefixAware().order(kids, lambda x: x)
    assert [k.parent for k in ordered] == [a.uid, a.uid, a.uid, b.uid, b.uid]
    greedy = greedy_order([k.prompt_ids for k in kids])
    assert [kids[i].parent for i in greedy] == [k.parent for k in ordered]


def test_prefix_aware_beats_random_at_small_cache():
    def hit_rate(ordering, blocks):
        outs, *_ = run(endless, n=16, m=4, iters=4, cap=2, ordering=ordering, eos_at_depth_limit=False,
                       cache_blocks=blocks)
        m = outs[0].metrics
        return m.gen_cached_tokens / m.gen_prompt_tokens

    # a cache that holds about one path: siblings back to back reuse it, random order not
    assert hit_rate("prefix_aware", 12) > hit_rate("random", 12) + 0.05
    # a cache that holds everything: order does not matter
    assert hit_rate("prefix_aware", 1 << 20) == hit_rate("random", 1 << 20)


class Generation:
    """One iteration's generation through its public interface (begin, advance with each
    generator step while active, end), with run-on or branch speculation (`rule`); the
    tokens it generated are counted by a metrics collector, as in the engine. Every request
    belongs to problem "p" (its branches go to that problem's table of speculative steps)."""

    def __init__(self, gen, rule="runon", spec_batch_cap=0):
        import random

        from tts.engine.barrier_generation import IterationGeneration
        from tts.engine.inflight import ScheduleParts
        from tts.engine.model_runner import ModelRunner
        from tts.engine.ordering import Fifo
        from tts.engine.problem import Problem, ProblemInput
        from tts.engine.requests import Request
        from tts.engine.scoring import ScoringPhase
        from tts.engine.speculation.iteration import IterationSpeculation
        from tts.engine.speculation.registry import make_rule
        from tts.engine.step_cutter import StepCutter
        from tts.metrics.collector import MetricsCollector
        from tts.search.base import ProblemSearch

        self.collector = MetricsCollector()
        self.metrics = self.collector.start("p")
        self.problem = Problem(ProblemInput("p", "q"), ProblemSearch("p", "q", (), 0), self.metrics, random.Random(0))
        self.runner = ModelRunner(gen, ScoringPhase(None, None), self.collector, 0.0, 1.0)
        cut = StepCutter(gen)

        def complete(request):  # the schedule's commit: the step joins its beam
            for step in cut.steps(request, 10**6):
                request.beam.append(step)

        def requests_for(problem, beams, iteration):  # a speculative step's request
            return [Request(b, 50, problem=problem) for b in beams]

        opts = EngineOptions(speculative=True, spec_rule=rule, spec_max_tokens=50)
        parts = ScheduleParts(make_policy(SearchConfig(), 50, 300), self.runner, cut, opts, self.collector, None,
                              Fifo(), "s")
        self.speculation = IterationSpeculation(make_rule(parts, requests_for, "barrier"))
        self.phase = IterationGeneration(self.runner, cut, complete, self.speculation, spec_batch_cap=spec_batch_cap)

    def run(self, requests):
        for request in requests:
            request.problem = request.problem or self.problem
        self.phase.begin(requests)
        while self.phase.active:
            self.phase.advance(*self.runner.step(self.runner.take_plan()))
        self.phase.end()
        self.runner.flush()

    def release(self):
        self.phase.release()
        self.runner.flush()


def test_speculative_slots_go_to_the_highest_bins_first():
    """Cap 2 (real + speculative): while three real requests run, nobody speculates; the
    requests that finished meanwhile are parked; when a slot frees, the highest priority
    gets it, restarting from its path if it had been parked."""
    from tts.engine.requests import Request

    lengths = {11: 1, 12: 2, 13: 3, 14: 12}  # seed -> step length (chars = tokens)

    def script(problem, steps, seed):
        return "a" * lengths[seed] + "\n\n"

    gen = FakeGenerator(script, batch_cap=8)
    prompt = tuple(gen.encode_prompt("q", "s"))
    prios = {11: 1, 12: 3, 13: 2, 14: 1}
    jobs = [Request(Beam("p", prompt, seed), limit=30, spec_priority=prios[seed]) for seed in (11, 12, 13, 14)]
    Generation(gen, spec_batch_cap=2).run(jobs)
    spec = {j.beam.seed: len(j.runon_tokens) for j in jobs}
    # seeds 11 and 12 finish while 3+ requests are pending: parked. When 13 finishes only
    # 14 is pending: one free slot, and 12 (priority 3) takes it over 13 (2) and 11 (1).
    assert spec[12] > 0 and spec[11] == 0 and spec[13] == 0
    assert all(j.end is not None for j in jobs)
    assert gen.num_unfinished() == 0


def test_no_speculation_past_a_step_that_completes_the_path():
    """A step with a boxed answer completes its path: no child will use what a run-on or
    a branch would generate past it, so neither starts; a plain step still speculates."""
    from tts.engine.requests import Request

    steps = {11: "so \\boxed{2}\n\n", 12: "a\n\n", 13: "a" * 12 + "\n\n"}  # seed -> its step

    def script(problem, done, seed):
        return steps[seed] if not done else "b" * 8 + "\n\n"

    for branches in (False, True):
        gen = FakeGenerator(script, batch_cap=8)
        prompt = tuple(gen.encode_prompt("q", "s"))
        jobs = {seed: Request(Beam("p", prompt, seed), limit=30, spec_priority=1) for seed in steps}
        generation = Generation(gen, rule="branches" if branches else "runon")
        generation.run(list(jobs.values()))
        assert gen.decode(jobs[11].tokens) == steps[11]  # its own step is whole
        assert not jobs[11].runon_tokens and not generation.speculation.steps.of(jobs[11]), branches
        assert jobs[12].runon_tokens or generation.speculation.steps.of(jobs[12]), branches  # the short plain step speculated
        assert generation.metrics.spec_generated > 0
        generation.release()
        assert gen.num_unfinished() == 0


def test_speculative_branches_keep_the_tree_and_serve_duplicates():
    """Branches mode: branch k is child k's own next step (child k's seed), so duplicates
    adopt whole steps of their own and the tree equals the baseline's, with fewer
    generator steps than the baseline and more adopted tokens than run-on with R=0."""
    for algo in (Algorithm.beam, Algorithm.dvts):
        kw = dict(algo=algo, n=8, m=2, iters=5, problems=("a", "b"))
        base, beng, *_ = run(answering, **kw)
        runon, reng, *_ = run(answering, speculative=True, spec_truncate_ratio=0.0, spec_truncate_std=0.0, **kw)
        br, eng, _, _ = run(answering, speculative=True, lookahead=True, ordering="prefix_aware",
                            spec_rule="branches", **kw)
        assert candidates(br) == candidates(base), algo
        used = sum(o.metrics.spec_used for o in br)
        assert used > sum(o.metrics.spec_used for o in runon), algo
        assert 0 < used <= sum(o.metrics.spec_generated for o in br)
        assert eng.collector.logs["generator"].steps < beng.collector.logs["generator"].steps, algo
        assert eng.cache.lookahead_hits > 0
        # every branch ends once, counted as the decoupled schedule counts its speculative steps
        spec = eng.step_logs()["speculation"]
        assert spec["spec_steps_whole"] > 0 and spec["spec_used"] == used
        assert spec["spec_generated"] == spec["spec_used"] + spec["spec_wasted"], algo
        assert reng.step_logs()["speculation"]["spec_steps_whole"] == 0  # run-on has no speculative steps to adopt


def test_under_vllm_sampling_branches_keep_the_tree_and_run_on_does_not():
    """With the fake backend sampling like vLLM (a request's random stream starts at its
    first token), the paper's run-on speculation changes the tree: the step a request
    runs on into is not the one a fresh request with the child's seed samples. Branches
    start every speculative step as that fresh request and keep the baseline's tree."""
    for algo in (Algorithm.beam, Algorithm.dvts):
        kw = dict(algo=algo, n=8, m=2, iters=5, problems=("a", "b"), sampling="stream")
        base, *_ = run(answering, **kw)
        runon, *_ = run(answering, speculative=True, spec_truncate_ratio=0.0, spec_truncate_std=0.0, **kw)
        br, eng, *_ = run(answering, speculative=True, lookahead=True, ordering="prefix_aware",
                          spec_rule="branches", **kw)
        assert candidates(br) == candidates(base), algo
        assert sum(o.metrics.spec_used for o in br) > 0
        assert candidates(runon) != candidates(base), algo


def test_branches_never_outgrow_the_generator_batch_cap():
    """A speculative cap above the generator's batch cap (the ridge batch on a device whose
    batch M has set lower) must not push branches into the backend's waiting queue: a
    waiting request preempts all speculation, and the branches would restart every step."""
    kw = dict(n=8, m=2, iters=5, problems=("a", "b"), cap=8, speculative=True, spec_rule="branches")
    outs = {c: run(answering, spec_batch_cap=c, **kw) for c in (8, 16)}
    calls = {c: len(gen.calls) for c, (_, _, gen, _) in outs.items()}
    assert calls[16] == calls[8]
    assert candidates(outs[16][0]) == candidates(outs[8][0])
    assert sum(o.metrics.spec_used for o in outs[16][0]) > 0


def test_branches_follow_the_bins_and_child_seeds():
    """A finished request with priority p starts p branches, branch k with child k's seed
    on its path; each stops at its own step boundary; the real request is stopped."""
    from tts.engine.requests import Request
    def script(problem, steps, seed):
        return ("a" if not steps else "b") * (1 + seed % 5) + "\n\n"

    gen = FakeGenerator(script, batch_cap=8)
    prompt = tuple(gen.encode_prompt("q", "s"))
    slow = Request(Beam("p", prompt, 4), limit=30)  # 5 tokens + boundary: keeps generation open
    fast = Request(Beam("p", prompt, 20), limit=30, spec_priority=3)  # 1 token + boundary
    generation = Generation(gen, rule="branches")
    generation.run([slow, fast])
    assert not fast.runon_tokens and [b.beam.seed for b in generation.speculation.steps.of(fast)] == [fast.beam.seed_of_child(k) for k in range(3)]
    steps = generation.speculation.steps.steps_of(fast)
    assert {gen.decode(t) for t in steps.values()} == {"b\n\n"}  # child 0 (seed 10): whole, stopped at its end
    running = {seed: branch for (parent, seed), branch in generation.problem.spec_table.items()
               if parent == fast.beam.uid and branch.state.in_backend}
    assert set(running) == {fast.beam.seed_of_child(1), fast.beam.seed_of_child(2)}  # still running: they wait for selection
    for seed, branch in running.items():
        text = gen.decode(branch.tokens)
        assert text and ("b" * (1 + seed % 5) + "\n\n").startswith(text)  # a prefix of child k's step
    assert not generation.speculation.steps.of(slow)  # priority 0: no branches
    assert gen.num_unfinished() == 2
    # selection keeps child 1 only: it runs on its branch's request, the other is stopped
    assert fast.beam.step_texts == (gen.decode(fast.tokens),)  # its step, committed as it finished
    seed = fast.beam.seed_of_child(1)
    child, calls = Request(fast.beam.fork(seed), limit=30), len(gen.calls)
    generation.run([child])
    assert gen.decode(child.tokens) == "b" * (1 + seed % 5) + "\n\n"
    assert child.adopted == len(running[seed].tokens) > 0
    assert len(gen.calls) == calls  # no new request
    assert gen.num_unfinished() == 0 and not generation.problem.spec_table  # nothing left behind
    generation.release()


def test_a_spec_rule_needs_speculation_and_the_old_switch_names_it():
    """`optim.spec_rule` picks speculation's start rule; on the barrier it needs
    `speculative`. A config that still sets `optim.spec_branches` is told what replaces it,
    and a run saved with it reads as `spec_rule=branches`."""
    from tts.config.compose import ConfigError, compose
    from tts.config.replaced import upgrade_saved
    from tts.config.schema import OptimConfig

    with pytest.raises(ValueError, match="optim.spec_rule: needs optim.speculative=true"):
        OptimConfig(spec_rule="branches")
    with pytest.raises(ConfigError, match="'optim.spec_branches' is no longer a config key: use optim.spec_rule"):
        compose("config", ["optim.spec_branches=true"])
    assert upgrade_saved({"optim": {"spec_branches": True}}) == {"optim": {"spec_rule": "branches"}}
    assert upgrade_saved({"optim": {"spec_branches": False}}) == {"optim": {}}


def test_an_unknown_or_misplaced_spec_rule_names_the_valid_ones():
    for schedule, rule, needle in (("barrier", "nope", "unknown 'nope' .*; valid choices: auto, none, runon"),
                                   ("barrier", "scoped", "'scoped' runs on the decoupled schedule"),
                                   ("decoupled", "runon", "valid choices there: auto, none, scoped")):
        with pytest.raises(ValueError, match=needle):
            Engine(FakeGenerator(endless), FakeVerifier(), lambda: make_policy(SearchConfig(), 30, 300), "sys",
                   EngineOptions(speculative=True, spec_rule=rule), schedule=schedule)


def test_fake_stream_sampling_draws_like_vllm():
    """`stream`: a request that starts at a step boundary samples the script's step for its
    seed; the step it runs on into, or one it resumes mid-way, comes from another stream
    position. `context`: all three are the script's steps."""
    from tts.backends.base import GenRequest
    from tts.backends.fake import encode

    def script(problem, steps, seed):
        return f"<{len(steps)}:{seed}>\n\n"

    def sample(sampling, prefix, max_tokens):
        gen = FakeGenerator(script, sampling=sampling)
        gen.add(GenRequest("r", tuple(gen.encode_prompt("q", "s") + encode(prefix)), max_tokens, 5, 1.0, 1.0))
        out = []
        while gen.num_unfinished():
            deltas, _ = gen.step()
            out += [t for d in deltas for t in d.new_token_ids]
        return gen.decode(out)

    fresh = "<0:5>\n\n"
    assert sample("stream", "", len(fresh)) == sample("context", "", len(fresh)) == fresh
    run_on = sample("stream", "", 2 * len(fresh))
    assert run_on.startswith(fresh) and run_on[len(fresh):] != "<1:5>\n\n"  # the next step differs
    assert sample("context", "", 2 * len(fresh)) == fresh + "<1:5>\n\n"
    assert sample("context", "<0:", 4) == "5>\n\n"  # resumed: the rest of the same step
    assert sample("stream", "<0:", 4) != "5>\n\n"
    assert sample("stream", fresh, 7) == "<1:5>\n\n"  # a fresh request for the next step
    assert not FakeGenerator(script, sampling="stream").resumable_sampling
    assert FakeGenerator(script).resumable_sampling


def straggling(problem, steps, seed):
    """Seed 3 keeps generation open long past a speculation pause; the others' steps are
    short, their length by seed."""
    if seed == 3:
        return "s" * 60 + "\n\n"
    return ("a" if not steps else "b") * (6 + seed % 5) + "\n\n"


def short_memory_at(gen, watched, at=2):
    """Make `gen` report requests waiting in the backend (memory is short) for `WAIT_STEPS`
    steps running, from the step in which `watched()` (a running request and its
    speculative tokens, or None) holds `at` + 1 tokens. Returns what it saw: `before`, those
    tokens with the last such step's."""
    from tts.backends.base import StepStats
    from tts.engine.speculation.memory import WAIT_STEPS

    orig, seen = gen.step, {}

    def step():
        deltas, st = orig()
        found = watched()
        mine = [d for d in deltas if found is not None and d.request_id == found[0].request_id]
        if mine and "waits" not in seen and len(found[1]) == at:
            seen["waits"] = 0
        if mine and seen.get("waits", WAIT_STEPS) < WAIT_STEPS:
            seen["waits"] += 1
            seen["before"] = len(found[1]) + len(mine[0].new_token_ids)
            st = StepStats(st.num_running, 1, st.num_scheduled_tokens, st.batch_cap, st.token_cap,
                           st.kv_usage, st.wall_s, st.tokens_per_request)
        return deltas, st

    gen.step = step
    return seen


def test_preempted_branch_resumes_where_sampling_is_resumable():
    """A branch preempted part-way (memory short: requests wait in the backend two steps
    running) resumes from its tokens under `context` sampling (vLLM with the position-keyed
    sampler) and restarts from its path under `stream` (vLLM's own sampler); either way it
    ends as child k's own step, and resuming generates no token twice."""
    from tts.engine.speculation.memory import WAIT_STEPS
    from tts.engine.requests import Request
    for mode in ("context", "stream"):
        gen = FakeGenerator(straggling, batch_cap=8, sampling=mode)
        prompt = tuple(gen.encode_prompt("q", "s"))
        parent = Request(Beam("p", prompt, 10), limit=30, spec_priority=1)
        straggler = Request(Beam("p", prompt, 3), limit=80)
        generation = Generation(gen, rule="branches")

        def branch():
            node = next(iter(generation.speculation.steps.of(parent)), None)
            return (node, node.tokens) if node is not None else None

        seen = short_memory_at(gen, branch)  # three tokens in, real work starts waiting
        generation.run([parent, straggler])
        (branch,) = generation.speculation.steps.of(parent)  # priority 1: child 0's branch
        assert seen["before"] == 2 + WAIT_STEPS and straggler.finished
        assert branch.finished and branch.beam.seed == parent.beam.seed_of_child(0) == 10
        assert gen.decode(branch.tokens) == "b" * (6 + branch.beam.seed % 5) + "\n\n"  # child 0's own step
        redone = seen["before"] if mode == "stream" else 0
        assert branch.generated == len(branch.tokens)  # since its restart, under `stream`
        assert generation.collector.speculation.wasted == redone
        steps = generation.collector.speculation.steps  # counted as the decoupled schedule counts
        assert steps["preempted"] == 1 and steps["reset"] == (mode == "stream")
        assert generation.speculation.steps.steps_of(parent) == {branch.beam.seed: tuple(branch.tokens)}
        assert gen.num_unfinished() == 0


def test_a_preempted_run_on_is_counted_and_reset_where_sampling_is_not_resumable():
    """Run-on is a rule over the shared mechanism: memory pressure (requests waiting in the
    backend two steps running) preempts a running run-on, counted in the speculation log as
    every rule's preemptions are. Under `context` sampling it resumes from its tokens; under
    `stream` (vLLM's own sampler) they are reset and it restarts from its committed path.
    Either way its tokens past the step are then its beam's own next step."""
    from tts.engine.requests import Request
    from tts.engine.speculation.memory import WAIT_STEPS

    for mode in ("context", "stream"):
        gen = FakeGenerator(straggling, batch_cap=8, sampling=mode)
        prompt = tuple(gen.encode_prompt("q", "s"))
        fast = Request(Beam("p", prompt, 10), limit=30, spec_priority=1)  # its steps: 6 tokens and the boundary
        straggler = Request(Beam("p", prompt, 3), limit=80)
        generation = Generation(gen)  # run-on, the default rule
        seen = short_memory_at(gen, lambda: (fast, fast.runon_tokens))  # from its third token past the step
        generation.run([fast, straggler])
        assert seen["before"] == 2 + WAIT_STEPS and straggler.finished
        steps = generation.collector.speculation.steps
        assert steps["preempted"] == 1 and steps["reset"] == (mode == "stream"), mode
        assert generation.collector.speculation.wasted == (seen["before"] if mode == "stream" else 0)
        assert generation.runner.free_slots() == 8 and gen.num_unfinished() == 0
        assert gen.decode(fast.runon_tokens).startswith("b" * 6 + "\n\n"), mode  # its beam's own next step


def test_one_memory_rule_stops_speculation_in_both_disciplines():
    """Memory is short at `kv_spec_limit` KV usage or after `WAIT_STEPS` steps with requests
    queued in the backend (one such step may be a prefill waiting for the token budget);
    after a preemption no speculation starts for `PAUSE_STEPS` steps. Both disciplines
    hold this guard, with the one default limit."""
    from tts.backends.base import StepStats
    from tts.config.enums import EngineKind
    from tts.config.schema import OptimConfig
    from tts.engine.speculation.memory import PAUSE_STEPS, WAIT_STEPS, MemoryGuard
    from tts.engine.options import KV_SPEC_LIMIT, decoupled_options

    def stats(waiting=0, kv=0.1):
        return StepStats(4, waiting, 4, 8, 64, kv, 0.01, 1.0)

    guard = MemoryGuard(0.9)
    for _ in range(WAIT_STEPS - 1):
        guard.observe(stats(waiting=1))
        assert not guard.short() and guard.allows()
    guard.observe(stats(waiting=1))
    assert guard.short() and not guard.allows()
    guard.observe(stats())
    assert not guard.short()
    guard.observe(stats(kv=0.9))
    assert guard.short()
    guard.preempted()
    for _ in range(PAUSE_STEPS - 1):
        guard.observe(stats())
        assert not guard.short() and not guard.allows()  # the pause
    guard.observe(stats())
    assert guard.allows()

    cfg = SearchConfig(n=4, beam_width=2, max_iterations=3)
    engines = [Engine(FakeGenerator(endless), FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys",
                      EngineOptions(speculative=True, decoupled=decoupled_options(OptimConfig(engine=EngineKind.decoupled))),
                      schedule=name) for name in ("barrier", "decoupled")]
    guards = [engines[0].schedule.speculation.memory, engines[1].schedule.speculation.memory]
    assert all(type(g) is MemoryGuard and g.kv_spec_limit == KV_SPEC_LIMIT for g in guards)


def test_counters_of_problems_in_flight_add_up_to_the_backends():
    """With several problems in flight, each problem gets its own requests' counters, so
    they add up to what the backends did (an even split rounded down lost the remainders
    and gave a problem another's speculative tokens)."""
    from tts.metrics.measures import split_exactly

    gen = FakeGenerator(endless, batch_cap=6)
    produced = []
    gen.add_step_observer(lambda deltas, stats, wall_s: produced.extend(len(d.new_token_ids) for d in deltas))
    ver = FakeVerifier()
    cfg = SearchConfig(n=4, beam_width=2, max_iterations=3)
    eng = Engine(gen, ver, lambda: make_policy(cfg, 30, 300), "sys",
                     EngineOptions(concurrency=3, speculative=True, eos_at_depth_limit=False))
    outs = list(eng.run([ProblemInput(p, f"problem {p}") for p in ("a", "bb", "ccc", "dddd")]))
    metrics = [o.metrics for o in outs]
    assert sum(m.gen_tokens for m in metrics) == sum(produced)
    assert sum(m.scores_computed for m in metrics) == len(ver.scored)
    assert all(0 <= m.spec_used <= m.spec_generated for m in metrics)
    assert split_exactly(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert split_exactly(7, {"a": 0, "b": 5}) == {"a": 0, "b": 7}
    assert split_exactly(5, {"a": 0, "b": 0}) == {"a": 3, "b": 2}


def test_a_path_asked_twice_in_one_call_is_computed_once():
    """Identical siblings ask for the same path in one verifier call: with the score
    cache it is computed once and both get the score; without it (search-and-learn's
    loop, which rescored everything) it is computed for each."""
    from tts.engine.scoring import ScoreCache, ScoreItem, ScoringPhase
    from tts.search.tree import Step, StepEnd

    def twins():
        a = Beam("p", (1,), seed=1)
        a.append(Step((5, 6), "one step\n\n", StepEnd.BOUNDARY))
        b = a.fork(2)
        return [ScoreItem(a, "problem", (0,)), ScoreItem(b, "problem", (0,))]

    for cache, computed in ((ScoreCache(), 1), (None, 2)):
        ver = FakeVerifier()
        items = twins()
        stats = ScoringPhase(ver, cache).run(items)
        assert len(ver.scored) == computed and stats.computed == computed
        assert items[0].beam.scores == items[1].beam.scores != (None,)


def test_score_cache_counts_a_lookahead_score_used_once_per_problem():
    from tts.engine.scoring import ScoreCache

    cache = ScoreCache()
    cache.put("a", ("s1", "s2"), 0.5, lookahead=True)
    cache.put("a", ("s1",), 0.4)
    cache.put("b", ("t1", "t2"), 0.7, lookahead=True)
    assert cache.has("a", ("s1", "s2")) and cache.lookahead_hits == 0  # a check is not a use
    assert cache.get("a", ("s1", "s2")) == 0.5 and cache.get("a", ("s1", "s2")) == 0.5
    assert cache.get("a", ("s1",)) == 0.4  # not a lookahead score
    assert cache.lookahead_stored == 2 and cache.lookahead_hits == 1
    assert cache.lookahead_hits_by_problem == {"a": 1}
    cache.drop_problem("b")
    assert cache.get("b", ("t1", "t2")) is None and cache.lookahead_hits == 1


def test_backend_observers_see_every_call_until_removed():
    """`add_step_observer` / `add_score_observer`: the instrumentation hook of the backend
    contract (the profile sweep's meter uses it); nothing wraps a backend's methods."""
    from tts.backends.base import GenRequest, ScoreRequest

    gen, ver = FakeGenerator(endless_script, batch_cap=4), FakeVerifier()
    steps, calls = [], []
    remove = gen.add_step_observer(lambda deltas, stats, wall_s: steps.append((len(deltas), wall_s >= 0)))
    ver.add_score_observer(lambda stats, wall_s: calls.append(stats.num_requests))
    gen.add(GenRequest("r", tuple(gen.encode_prompt("p", "")), max_tokens=3, seed=1))
    while gen.num_unfinished():
        gen.step()
    assert steps == [(1, True)] * 3
    remove()
    gen.add(GenRequest("s", tuple(gen.encode_prompt("p", "")), max_tokens=2, seed=1))
    gen.step()
    assert len(steps) == 3 and gen.llm is None and ver.llm is None
    ver.score([ScoreRequest("p", ("a\n\n", "b"), (0, 1))])
    assert len(calls) == 1 and calls[0] >= 1


def test_engine_options_default_to_the_configs_own_defaults():
    """One builder from `OptimConfig` to the engine's typed options, and no default written
    twice: the options of a default `OptimConfig` are the options' own defaults, the
    adaptive and decoupled ones included; a switch set in the config reaches its option."""
    from tts.config.schema import OptimConfig
    from tts.engine.options import AdaptiveOptions, DecoupledOptions, options_for

    assert options_for(OptimConfig()) == EngineOptions()
    assert EngineOptions().adaptive == AdaptiveOptions() and EngineOptions().decoupled == DecoupledOptions()
    tuned = options_for(OptimConfig(engine="decoupled", spec_own_min_tokens=0, exit_top=2, verifier_batch_size=3,
                                    prefix_aware=True), concurrency=4)
    assert (tuned.spec_own_min_tokens, tuned.adaptive.exit_top, tuned.decoupled.verifier_batch_size,
            tuned.ordering, tuned.concurrency) == (0, 2, 3, "prefix_aware", 4)
