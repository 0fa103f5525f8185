"""Adaptive compute on the fake backend: early rejection inside a step, early exit when
the answer settles."""

import pytest

from tts.backends.fake import FakeGenerator, FakeVerifier
from tts.config.enums import Algorithm
from tts.config.schema import OptimConfig, SearchConfig
from tts.engine.options import AdaptiveOptions
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.engine.problem import hash_id
from tts.search import make_policy
from tts.search.tree import child_seed

STEP_LIMIT = 30


def first_seeds(problem_id: str, n: int, seed: int = 0) -> list[int]:
    """The seeds of a problem's first frontier, as the engine draws them."""
    base = (seed * 1_000_003 + hash_id(problem_id)) % (2**31 - 1)
    return [child_seed(base, i + 1, 0) for i in range(n)]


def run(script, scorer=None, n=4, m=2, iters=3, problems=("p",), schedule="barrier", read_partial=True, **adaptive):
    cfg = SearchConfig(algorithm=Algorithm.beam, n=n, beam_width=m, max_iterations=iters)
    gen = FakeGenerator(script, batch_cap=16)
    cls = FakeVerifier if read_partial else _WholeStepsOnly
    ver = cls(scorer) if scorer else cls()
    opts = EngineOptions(adaptive=AdaptiveOptions(**adaptive))
    eng = Engine(gen, ver, lambda: make_policy(cfg, STEP_LIMIT, 300), "sys", opts, schedule=schedule)
    return list(eng.run([ProblemInput(p, f"problem {p}") for p in problems])), gen


class _WholeStepsOnly(FakeVerifier):
    """A verifier that scores whole steps only, as a PRM head does."""

    reads_partial_steps = False


def trees(outs):
    return [(o.problem.id, [b.step_texts for b in o.candidates]) for o in outs]


@pytest.mark.parametrize("schedule", ["barrier", "decoupled"])
def test_a_beam_that_cannot_make_the_cut_stops_at_the_exact_step_and_token(schedule):
    """N=4, M=2 keeps 2. Two first-iteration beams write a long low-scored step; the two
    others finish a short step by generator step 5, when the partial scoring is due:
    both long steps, 5 tokens in, lie below 2 beams by more than the margin and stop
    there. Selection would have pruned them anyway: the tree is the baseline's, and the
    generator saved exactly the 25 tokens each long step had left. (The decoupled
    schedule scores the two short steps first, then the long ones as they stand.)"""
    low = set(first_seeds("p", 4)[:2])

    def script(problem, steps, seed):
        return "z" * 40 if not steps and seed in low else "aaa\n\n"

    def scorer(problem, path):
        return 0.1 if "z" in path[-1] else 0.9

    base, _ = run(script, scorer, schedule=schedule)
    adaptive, _ = run(script, scorer, schedule=schedule, early_reject=True, reject_interval=5, reject_margin=0.1)
    assert trees(adaptive) == trees(base)
    b, a = base[0].metrics, adaptive[0].metrics
    assert a.beams_rejected == 2 and a.rejected_above_cut == 0
    assert a.partial_scored == 2  # the two long steps, once: nothing else was left running
    assert 2 * (STEP_LIMIT - 5) == a.reject_tokens_saved
    if schedule == "barrier":  # (the decoupled schedule's speculation moves with the timing)
        assert b.gen_tokens - a.gen_tokens == a.reject_tokens_saved
    assert a.iterations == b.iterations


@pytest.mark.parametrize("schedule", ["barrier", "decoupled"])
def test_rejection_needs_the_margin_and_a_verifier_that_reads_partial_steps(schedule):
    """With the switch on but a margin no score can clear, or a verifier that cannot read
    a partial step, nothing is rejected and the tree is the baseline's."""
    def script(problem, steps, seed):
        return ("b" * (3 + seed % 17)) + "\n\n"

    base, _ = run(script, iters=4, problems=("a", "b"), schedule=schedule)
    scored = {}
    for name, kw in (("margin", dict(reject_margin=1.0)), ("whole steps only", dict(read_partial=False))):
        outs, _ = run(script, iters=4, problems=("a", "b"), schedule=schedule, early_reject=True, reject_interval=2,
                      **kw)
        assert trees(outs) == trees(base), name
        assert sum(o.metrics.beams_rejected for o in outs) == 0
        scored[name] = sum(o.metrics.partial_scored for o in outs)
    assert scored["margin"] > 0 and scored["whole steps only"] == 0  # it scored partial steps, where it could


def test_a_step_is_scored_as_it_stands_once_it_grew_by_the_interval():
    """On the decoupled schedule steps start at any time: when a partial scoring falls due,
    a step only 2 tokens old is left for later (it says little beyond its path's score),
    and a step scored as it stood is scored again only after `reject_interval` more
    tokens. With no step ripe, no scoring is due (the LLM round goes on)."""
    from tts.engine.rejection import EarlyRejection
    from tts.engine.requests import Request
    from tts.search.tree import Beam

    policy = make_policy(SearchConfig(algorithm=Algorithm.beam, n=4, beam_width=2, max_iterations=3), STEP_LIMIT, 300)
    rule = EarlyRejection(AdaptiveOptions(early_reject=True, reject_interval=5), policy, lambda t: "x" * len(t))
    old, young = (Request(Beam("p", (1,), seed), STEP_LIMIT) for seed in (1, 2))
    old.tokens, young.tokens = [7] * 6, [7] * 2

    def scored():
        rule.steps_since = 5
        if not rule.due([old, young]):
            return None
        return [i.beam.seed for i in rule.items("p", None, [old, young])]

    assert scored() == [1]
    old.tokens += [7] * 4  # 4 more since it was scored
    young.tokens += [7] * 3  # 5 since it began
    assert scored() == [2]
    assert scored() is None
    old.tokens.append(7)
    assert scored() == [1]


def answer_script(problem, steps, seed):
    """A beam states the answer 7 at its third step when its seed is even, else writes on."""
    return "so \\boxed{7}\n\n" if len(steps) == 2 and seed % 2 == 0 else f"step {len(steps)}\n\n"


def answer_scorer(problem, path):
    """Answered paths rank first, so the final candidates show them all."""
    return 0.9 if "boxed" in path[-1] else 0.5


@pytest.mark.parametrize("schedule", ["barrier", "decoupled"])
def test_early_exit_fires_at_the_exact_iteration(schedule):
    """The search stops after the first iteration at which the `exit_top` best completed
    candidates agree, held for `exit_patience` iterations; its candidates are the paths
    completed by then. Read off the full run: the iteration by which 2 paths completed."""
    full, _ = run(answer_script, answer_scorer, n=8, m=2, iters=8)
    depths = sorted(b.depth for b in full[0].candidates if "boxed" in b.text)
    for patience in (1, 2):
        outs, _ = run(answer_script, answer_scorer, n=8, m=2, iters=8, schedule=schedule, early_exit=True, exit_top=2,
                      exit_agree=1.0, exit_patience=patience)
        expected = depths[1] + patience - 1  # iterations done when the second path completed, then patience
        m = outs[0].metrics
        assert m.settled_at == expected == m.iterations, (patience, depths)
        assert m.iterations < full[0].metrics.iterations
        assert {b.text.strip().splitlines()[-1] for b in outs[0].candidates} == {"so \\boxed{7}"}


def test_early_exit_compares_at_most_half_the_search_width(caplog):
    """A search of N=4 ends once 4 paths have completed, so the presets' `exit_top` of 4
    could never agree before the end: it compares 2, as `exit_top=2` does, and says so."""
    full, _ = run(answer_script, answer_scorer, n=4, m=2, iters=8)
    kw = dict(n=4, m=2, iters=8, early_exit=True, exit_agree=1.0, exit_patience=1)
    two, _ = run(answer_script, answer_scorer, exit_top=2, **kw)
    four, _ = run(answer_script, answer_scorer, exit_top=4, **kw)
    assert four[0].metrics.settled_at == two[0].metrics.settled_at == four[0].metrics.iterations
    assert four[0].metrics.iterations < full[0].metrics.iterations and trees(four) == trees(two)
    assert "optim.exit_top=4 with search.n=4: early exit compares the best 2" in caplog.text


def test_early_exit_waits_for_agreement():
    """Four paths answer at the second iteration, 0, 0, 1 and 2: half agree. With
    `exit_agree` 1 the search never settles and runs to its end; with 0.5 it stops right
    after that iteration."""
    def script(problem, steps, seed):
        return f"so \\boxed{{{seed % 3}}}\n\n" if len(steps) == 1 and seed % 5 == 1 else "a\n\n"

    base, _ = run(script, answer_scorer, n=8, m=2, iters=5)
    answers = sorted(b.step_texts[1] for b in base[0].candidates if "boxed" in b.text)
    assert answers == ["so \\boxed{0}\n\n", "so \\boxed{0}\n\n", "so \\boxed{1}\n\n", "so \\boxed{2}\n\n"]
    kw = dict(n=8, m=2, iters=5, early_exit=True, exit_top=4, exit_patience=1)
    outs, _ = run(script, answer_scorer, exit_agree=1.0, **kw)
    assert outs[0].metrics.settled_at is None and trees(outs) == trees(base)
    settled, _ = run(script, answer_scorer, exit_agree=0.5, **kw)
    assert settled[0].metrics.settled_at == 2 == settled[0].metrics.iterations < base[0].metrics.iterations


def test_adaptive_switches_are_validated():
    with pytest.raises(ValueError, match="optim.exit_agree"):
        OptimConfig(exit_agree=0.0)
    OptimConfig(engine="decoupled", early_reject=True)  # on either schedule
    with pytest.raises(ValueError, match="optim.reject_interval"):
        OptimConfig(reject_interval=0)


def test_a_run_reports_adaptive_compute_and_draws_the_frontier(tmp_path):
    """`PMS_adaptive` next to the baseline through `tts bench`: the summary carries what
    each switch did, and the run folder the accuracy frontier."""
    import json

    from tts.config.compose import compose
    from tts.runner import run_bench

    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=4", "search.n=8",
                             "search.beam_width=2", "search.max_iterations=6", f"bench.results_dir={tmp_path}",
                             "bench.run_name=run", "bench.compare=[baseline,PMS_adaptive]",
                             "optim.reject_interval=1"])
    path = run_bench(cfg)
    variants = json.loads((path / "summary.json").read_text())["variants"]
    base, adaptive = variants["baseline"], variants["PMS_adaptive"]
    assert base["total_partial_scored"] == base["total_beams_rejected"] == 0 and base["settled_share"] == 0
    assert adaptive["total_partial_scored"] > 0
    assert 0 <= adaptive["settled_share"] <= 1 and "acc_majority_ci" in adaptive
    assert (path / "plots" / "accuracy_frontier.png").exists()


def sampling(script, algo, n=8, wave=0, **adaptive):
    cfg = SearchConfig(algorithm=algo, n=n, sample_wave=wave, max_iterations=8)
    gen = FakeGenerator(script, batch_cap=16)
    eng = Engine(gen, FakeVerifier(answer_scorer), lambda: make_policy(cfg, STEP_LIMIT, 300), "sys",
                 EngineOptions(adaptive=AdaptiveOptions(**adaptive)))
    return list(eng.run([ProblemInput("p", "problem p")]))[0]


@pytest.mark.parametrize("algo", [Algorithm.self_consistency, Algorithm.best_of_n])
def test_adaptive_sampling_stops_drawing_once_the_answers_agree(algo):
    """Samples drawn 2 at a time are the same 8 samples as one wave of 8; with early exit,
    drawing stops after the wave at which 3 answers agree: the second."""
    def script(problem, steps, seed):
        return f"{seed % 7} so \\boxed{{7}}"  # one step, then EOS

    whole = sampling(script, algo)
    waves = sampling(script, algo, wave=2)
    assert sorted(b.text for b in waves.candidates) == sorted(b.text for b in whole.candidates)
    assert waves.metrics.iterations == 4 and whole.metrics.iterations == 1
    early = sampling(script, algo, wave=2, early_exit=True, exit_top=3, exit_agree=1.0, exit_patience=1)
    assert early.metrics.settled_at == 2 == early.metrics.iterations
    assert early.metrics.gen_tokens == whole.metrics.gen_tokens // 2  # 4 of the 8 samples drawn


def test_sample_wave_is_validated():
    with pytest.raises(ValueError, match="search.sample_wave"):
        SearchConfig(algorithm=Algorithm.self_consistency, n=4, sample_wave=5)
