"""Each policy's exact expansions and selections on literal beams."""

import pytest

from tts.config.enums import Algorithm
from tts.config.schema import SearchConfig
from tts.search import make_policy
from tts.search.base import ProblemSearch, aggregate, expand
from tts.search.dynamic_branching import branch_counts
from tts.search.tree import Beam, BeamState, Step, StepEnd, child_seed


def beam(text: str, score: float, seed: int, end=StepEnd.BOUNDARY, group=0) -> Beam:
    b = Beam("p", (1, 2), seed, group=group)
    b.append(Step(tuple(range(len(text))), text, end))
    b.set_score(0, score)
    return b


def search_with(frontier):
    s = ProblemSearch("p", "problem", (1, 2), 7)
    s.frontier = frontier
    return s


def policy(algo, n=4, m=2, iters=10, **kw):
    return make_policy(SearchConfig(algorithm=algo, n=n, beam_width=m, max_iterations=iters, **kw), 10, 100)


def test_aggregate():
    assert aggregate([0.5, None, 0.25], "last") == 0.25
    assert aggregate([0.5, 0.25], "min") == 0.25
    assert aggregate([0.5, 0.5], "prod") == 0.25
    assert aggregate([0.5, 0.25], "mean") == 0.375
    assert aggregate([], "last") == 0.0


def test_beam_keeps_top_n_over_m_and_refills_interleaved():
    p = policy(Algorithm.beam, n=4, m=2)
    a, b, c, d = beam("a\n\n", 0.1, 11), beam("b\n\n", 0.9, 12), beam("c\n\n", 0.5, 13), beam("d\n\n", 0.7, 14)
    s = search_with([a, b, c, d])
    p.select(s, now=1.0)
    assert [x.state for x in (a, b, c, d)] == [BeamState.PRUNED, BeamState.ACTIVE, BeamState.PRUNED, BeamState.ACTIVE]
    # search-and-learn's refill: kept beams in frontier order, repeated: b, d, b, d
    assert [x.parent for x in s.frontier] == [b.uid, d.uid, b.uid, d.uid]
    assert [x.seed for x in s.frontier] == [12, 14, b.seed_of_child(1), d.seed_of_child(1)]
    assert all(x.text == y.text for x, y in zip(s.frontier, [b, d, b, d]))


def test_beam_completes_boxed_and_eos_paths_and_ties_keep_earlier():
    p = policy(Algorithm.beam, n=4, m=2)
    done = beam("so \\boxed{3}\n\n", 0.99, 1)
    eos = beam("end", 0.98, 2, end=StepEnd.EOS)
    x, y = beam("x\n\n", 0.5, 3), beam("y\n\n", 0.5, 4)
    s = search_with([done, eos, x, y])
    p.select(s, now=2.5)
    assert s.completed == [done, eos] and done.completed_at == 2.5
    assert [b.parent for b in s.frontier] == [x.uid, y.uid, x.uid, y.uid]


def test_beam_last_iteration_completes_everything():
    p = policy(Algorithm.beam, n=2, m=2, iters=1)
    s = search_with([beam("a\n\n", 0.1, 1), beam("b\n\n", 0.2, 2)])
    p.select(s, now=0.0)
    assert s.frontier == [] and len(s.completed) == 2


def test_filter_duplicates():
    p = policy(Algorithm.beam, n=4, m=2, filter_duplicates=True)
    a1, a2, b1, c1 = beam("a\n\n", 0.9, 1), beam("a\n\n", 0.8, 2), beam("b\n\n", 0.1, 3), beam("c\n\n", 0.2, 4)
    s = search_with([a1, a2, b1, c1])
    p.select(s, now=0.0)
    assert a2.state is BeamState.PRUNED
    assert {x.parent for x in s.frontier} == {a1.uid, c1.uid}


def test_dvts_each_subtree_keeps_its_best():
    p = policy(Algorithm.dvts, n=4, m=2)
    g0 = [beam("a\n\n", 0.2, 1, group=0), beam("b\n\n", 0.3, 2, group=0)]
    g1 = [beam("c\n\n", 0.9, 3, group=1), beam("d \\boxed{1}\n\n", 0.95, 4, group=1)]
    s = search_with(g0 + g1)
    p.select(s, now=0.0)
    assert s.completed == [g1[1]]  # subtree 1's best finished: the subtree is done
    assert [x.parent for x in s.frontier] == [g0[1].uid, g0[1].uid]
    assert [x.group for x in s.frontier] == [0, 0]
    assert g0[0].state is BeamState.PRUNED


def test_dvts_start_makes_n_over_m_subtrees():
    p = policy(Algorithm.dvts, n=8, m=4)
    s = search_with([])
    p.start(s)
    assert [b.group for b in s.frontier] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({b.seed for b in s.frontier}) == 8


def test_best_of_n_and_self_consistency_finish_in_one_iteration():
    for algo, uses in ((Algorithm.best_of_n, True), (Algorithm.self_consistency, False)):
        p = policy(algo, n=3, m=1)
        assert not p.stops_at_boundary and p.uses_verifier is uses
        s = search_with([beam("x", 0.1, 1, StepEnd.EOS), beam("y", 0.2, 2, StepEnd.EOS)])
        p.select(s, now=1.0)
        assert s.frontier == [] and len(s.completed) == 2
        assert p.indices_to_score(s.completed[0], s) == ((0,) if uses else ())


def test_dynamic_branching_counts_proportional():
    assert branch_counts([0.6, 0.2, 0.2], 5) == [3, 1, 1]
    assert branch_counts([0.0, 0.0], 3) == [2, 1]
    assert branch_counts([1.0, 0.0], 4) == [4, 0]
    p = policy(Algorithm.dynamic_branching, n=4, m=2)
    a, b, c = beam("a\n\n", 0.75, 1), beam("b\n\n", 0.25, 2), beam("c\n\n", 0.1, 3)
    s = search_with([a, b, c])
    p.select(s, now=0.0)
    assert [x.parent for x in s.frontier] == [a.uid, a.uid, a.uid, b.uid]


def test_varying_granularity_limits_and_verify_every():
    p = make_policy(SearchConfig(algorithm=Algorithm.varying_granularity, n=4, beam_width=2,
                                 early_step_max_tokens=5, early_steps=2, verify_every=2), 50, 500)
    s = search_with([])
    shallow, deep = beam("a\n\n", 0.5, 1), beam("a\n\n", 0.5, 1)
    deep.append(Step((1,), "b\n\n", StepEnd.BOUNDARY))
    assert p.step_limit(shallow, s) == 5 and p.step_limit(deep, s) == 50
    s.iteration = 0  # iteration 1 of every 2: no verification, no pruning
    assert p.indices_to_score(shallow, s) == ()
    frontier = [beam("x\n\n", 0.1, 1), beam("y\n\n", 0.9, 2)]
    s.frontier = list(frontier)
    p.select(s, now=0.0)
    assert [b.parent for b in s.frontier] == [frontier[0].uid, frontier[1].uid]
    s.iteration = 1
    assert p.indices_to_score(shallow, s) == (0,)


def test_finalize_pads_to_n_sorted_by_score():
    p = policy(Algorithm.beam, n=4, m=2)
    s = search_with([])
    lo, hi = beam("l", 0.1, 1, StepEnd.EOS), beam("h", 0.9, 2, StepEnd.EOS)
    s.completed = [lo, hi]
    assert p.finalize(s) == [hi, lo, hi, lo]


def test_expand_child_seeds():
    a = beam("a\n\n", 0.5, 100)
    kids = expand([a], 3)
    assert [k.seed for k in kids] == [100, child_seed(100, 1, 1), child_seed(100, 2, 1)]
    assert all(k.parent == a.uid for k in kids)


def test_siblings_whose_steps_came_out_the_same_hand_on_distinct_seeds():
    """Two siblings with the same path (their steps came out the same) are two beams; every
    child of theirs samples with its own seed, as search-and-learn's duplicates sample
    independently. A seed hashed from the parent's seed and the child's index alone gave
    child 1 of the first the seed of the second, which keeps it as its child 0: two
    identical requests, then two identical subtrees."""
    for algo in (Algorithm.beam, Algorithm.dynamic_branching):
        p = policy(algo, n=4, m=2, iters=10)
        s = ProblemSearch("p", "problem", (1, 2), 7)
        p.start(s)
        for depth in range(4):
            for b in s.frontier:  # every beam writes the same step: all paths stay equal
                b.append(Step((5, 6), "x\n\n", StepEnd.BOUNDARY))
                b.set_score(depth, 0.5)
            p.select(s, now=float(depth))
            requests = [(b.seed, b.token_ids) for b in s.frontier]
            assert len(set(requests)) == len(requests) == 4, (algo, depth)


def test_unknown_algorithm():
    cfg = SearchConfig()
    cfg.algorithm = "nope"
    with pytest.raises(ValueError, match="valid choices: beam, dvts"):
        make_policy(cfg, 10, 10)


# ------------------------------------------------------------- likely_kept


def _random_frontier(rng, n, m, finished_share=0.0):
    out = []
    for i in range(n):
        end = StepEnd.EOS if rng.random() < finished_share else StepEnd.BOUNDARY
        # few distinct scores, so ties (kept: the earlier beam) occur
        out.append(beam(f"t{i}\n\n", rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]), 100 + i, end, group=i // m))
    return out


@pytest.mark.parametrize("algo", [Algorithm.beam, Algorithm.dvts, Algorithm.dynamic_branching,
                                  Algorithm.varying_granularity])
@pytest.mark.parametrize("iteration", [0, 1, 9])
def test_likely_kept_equals_select_when_every_score_is_known(algo, iteration):
    import random

    rng = random.Random(f"{algo}-{iteration}")
    for _ in range(40):
        n, m = rng.choice([(4, 2), (8, 4), (8, 2), (6, 3)])
        p = make_policy(SearchConfig(algorithm=algo, n=n, beam_width=m, max_iterations=10, verify_every=2), 10, 100)
        s = search_with(_random_frontier(rng, n, m, finished_share=0.2))
        s.iteration = iteration
        guess = p.likely_kept(s)
        p.select(s, now=0.0)
        children: dict[int, int] = {}
        for child in s.frontier:
            children[child.parent] = children.get(child.parent, 0) + 1
        assert {b.uid: c for b, c in guess} == children
        scores = [p.path_score(b) for b, _ in guess]
        assert scores == sorted(scores, reverse=True)  # best first


def test_likely_kept_ranks_an_unscored_step_by_its_path_so_far():
    p = policy(Algorithm.beam, n=4, m=2)
    a, b, c, d = beam("a\n\n", 0.2, 1), beam("b\n\n", 0.8, 2), beam("c\n\n", 0.6, 3), beam("d\n\n", 0.4, 4)
    for x in (a, b, c, d):
        x.append(Step((9,), "next\n\n", StepEnd.BOUNDARY))  # a second step, not scored yet
    a.set_score(1, 0.95)  # a's new step is scored, and now leads
    s = search_with([a, b, c, d])
    assert [(x, k) for x, k in p.likely_kept(s)] == [(a, 2), (b, 2)]
    assert p.likely_kept(search_with([])) == []
    s.iteration = 9  # last iteration: nothing is kept, everything completes
    assert p.likely_kept(s) == []


def test_policies_that_cannot_guess_say_so():
    assert policy(Algorithm.best_of_n, n=3, m=1).likely_kept(search_with([beam("x", 0.1, 1)])) is None
