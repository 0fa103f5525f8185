"""The step cost model: the fit recovers a machine's step costs, its sums add up across a
resume, and the bound is the least any schedule of the same work takes under it."""

import random

import pytest

from tts.backends.base import StepStats
from tts.metrics.cost_model import CostSums, fit, min_steps, work_bounds

A, B, C = 0.055, 0.004, 0.0024  # seconds per step, per decode sequence, per prefill token


def step(decode: int, prefill: int = 0, wall: float | None = None, batch_cap: int = 64,
         token_cap: int = 2048) -> StepStats:
    per_request = (1,) * decode + ((prefill,) if prefill else ())
    wall = A + B * decode + C * prefill if wall is None else wall
    return StepStats(len(per_request), 0, decode + prefill, batch_cap, token_cap, 0.0, wall, per_request)


def random_steps(rng: random.Random, n: int, noise: float = 0.0) -> list[StepStats]:
    out = []
    for _ in range(n):
        decode, prefill = rng.randint(0, 16), rng.choice([0, 0, 0, rng.randint(2, 400)])
        wall = (A + B * decode + C * prefill) * (1 + rng.uniform(-noise, noise))
        out.append(step(decode, prefill, wall))
    return out


def sums_of(steps: list[StepStats]) -> CostSums:
    sums = CostSums()
    for s in steps:
        sums.observe(s)
    return sums


def test_fit_recovers_the_step_costs():
    model = fit(sums_of(random_steps(random.Random(0), 300)))
    assert (model.step_s, model.per_decode_seq_s, model.per_prefill_token_s) == pytest.approx((A, B, C), rel=1e-6)
    assert model.r2 == pytest.approx(1.0) and model.steps == 300
    noisy = fit(sums_of(random_steps(random.Random(1), 2000, noise=0.1)))
    assert noisy.step_s == pytest.approx(A, rel=0.1) and noisy.per_decode_seq_s == pytest.approx(B, rel=0.1)
    assert noisy.per_prefill_token_s == pytest.approx(C, rel=0.1) and 0.5 < noisy.r2 < 1.0


def test_fit_drops_a_feature_that_never_varies_or_comes_out_negative():
    # a verifier's log: prompt requests only, never a decode sequence
    verifier = sums_of([step(0, p, 0.08 + C * p) for p in (40, 300, 900, 1200, 60)])
    model = fit(verifier)
    assert model.per_decode_seq_s == 0.0
    assert (model.step_s, model.per_prefill_token_s) == pytest.approx((0.08, C))
    # decode steps that get cheaper with more sequences: not a cost model, the feature goes
    odd = fit(sums_of([step(d, 0, 0.1 - 0.001 * d) for d in range(1, 9)]))
    assert odd.per_decode_seq_s == 0.0 and odd.step_s > 0
    assert fit(sums_of([step(1), step(2)])) is None  # too few steps to fit


def test_sums_add_up_like_one_log_of_all_steps():
    steps = random_steps(random.Random(2), 50)
    first, second = sums_of(steps[:20]), sums_of(steps[20:])
    whole = sums_of(steps)
    merged = CostSums.from_dict((first + second).to_dict())
    assert merged.steps == whole.steps == 50
    assert merged.batch_cap == whole.batch_cap and merged.xtx == whole.xtx  # integer features: exact
    assert merged.xty == pytest.approx(whole.xty) and merged.wall_s == pytest.approx(whole.wall_s)
    assert fit(merged).step_s == pytest.approx(fit(whole).step_s)


def test_min_steps_is_the_critical_path_or_what_the_caps_allow():
    assert min_steps(512, 10000, 3000, batch_cap=64) == 512
    assert min_steps(100, 10000, 0, batch_cap=64) == 157  # 10000 / 64 rounded up
    assert min_steps(0, 0, 5000, token_cap=2048) == 3
    assert min_steps(0, 0, 10) == 1 and min_steps(0, 0, 0) == 0


def test_no_schedule_of_the_work_beats_the_bound():
    """Decode a tree of paths in any order, any batch, under the exact cost model: the
    time is never below the bound, and a schedule that keeps the batch full along the
    longest path meets it."""
    rng = random.Random(3)
    lengths = [rng.randint(20, 300) for _ in range(16)]
    model = fit(sums_of(random_steps(rng, 100)))
    metrics = {"gen_tokens": sum(lengths) + len(lengths), "gen_requests": len(lengths),
               "gen_prompt_tokens": 16 * 200, "gen_cached_tokens": 16 * 180, "beam_tokens": [max(lengths)]}
    bound = work_bounds([metrics], model, None, (64, 4096))["gen_bound_s"]
    times = []
    for cap in (1, 4, 16):  # run paths `cap` at a time, prefill each when it starts
        left, t, running = list(lengths), 0.0, []
        while left or running:
            started = []
            while left and len(running) + len(started) < cap:
                started.append(left.pop())
            t += A + B * len(running) + C * 20 * len(started)
            running = [n - 1 for n in running if n > 1] + started  # each path: a prefill, then n decodes
        assert t >= bound - 1e-9
        times.append(t)
    assert times[0] > times[1] > times[2]  # fuller batches: closer to the bound
    assert times[2] == pytest.approx(bound + A * 1, rel=0.02)  # all at once: one prefill step over it
    assert bound == pytest.approx(A * max(lengths) + B * sum(lengths) + C * 16 * 20)


def test_the_trees_bound_leaves_unadopted_speculation_out():
    """Wasted speculation raises a variant's own bound (its tokens, and its steps through
    the batch cap), not the tree's; with no speculation the two agree."""
    model = fit(sums_of(random_steps(random.Random(5), 50)))
    tree = {"gen_tokens": 1604, "gen_requests": 4, "gen_prompt_tokens": 400, "gen_cached_tokens": 400,
            "beam_tokens": [100]}
    plain = work_bounds([tree], model, None, (16, 4096))
    assert plain == work_bounds([tree], model, None, (16, 4096), tree_only=True)
    assert plain["gen_bound_s"] == pytest.approx(A * 100 + B * 1600)  # 1600 / 16 = the critical path
    wasteful = dict(tree, gen_tokens=1604 + 800, spec_generated=1000, spec_used=200)
    own = work_bounds([wasteful], model, None, (16, 4096))["gen_bound_s"]
    assert own == pytest.approx(A * 150 + B * 2400)  # 2400 / 16 steps: above the path
    assert work_bounds([wasteful], model, None, (16, 4096), tree_only=True) == plain


def test_problem_bounds_need_a_model_for_each_model_that_worked():
    model = fit(sums_of(random_steps(random.Random(4), 50)))
    metrics = {"gen_tokens": 100, "gen_requests": 4, "gen_prompt_tokens": 400, "gen_cached_tokens": 320,
               "beam_tokens": [30, 25], "ver_prompt_tokens": 900, "ver_cached_tokens": 700, "ver_requests": 4}
    both = work_bounds([metrics], model, model, (64, 2048), (256, 2048))
    assert both["gen_bound_s"] == pytest.approx(A * 30 + B * 96 + C * 80)
    assert both["ver_bound_s"] == pytest.approx(A * 1 + C * 200)
    assert work_bounds([metrics], model, None)["ver_bound_s"] is None  # scored, but no verifier fit
    no_verifier = dict(metrics, ver_prompt_tokens=0, ver_cached_tokens=0, ver_requests=0)
    assert work_bounds([no_verifier], model, None)["ver_bound_s"] == 0.0
    assert work_bounds([metrics], None, model)["gen_bound_s"] is None


def test_problems_in_flight_together_share_steps_but_not_their_critical_paths():
    model = fit(sums_of(random_steps(random.Random(5), 50)))
    problems = [{"gen_tokens": 40, "gen_requests": 4, "gen_prompt_tokens": 100, "gen_cached_tokens": 60,
                 "beam_tokens": [n]} for n in (100, 60, 80)]
    decode, prefill = 3 * 36, 3 * 40

    def steps(concurrency: int) -> float:
        bound = work_bounds(problems, model, None, (64, 4096), concurrency=concurrency)["gen_bound_s"]
        return (bound - B * decode - C * prefill) / A

    assert steps(1) == pytest.approx(240)  # one at a time: the paths one after another
    assert steps(2) == pytest.approx(120)  # two critical paths advance per step at most
    assert steps(3) == pytest.approx(100) == steps(8)  # never below the longest path
    alone = sum(work_bounds([m], model, None, (64, 4096))["gen_bound_s"] for m in problems)
    assert alone == pytest.approx(work_bounds(problems, model, None, (64, 4096))["gen_bound_s"])


def test_time_above_the_bound_is_split_into_parts_that_add_up():
    """A schedule run under the exact cost model, one path at a time, with a preempted
    prompt computed twice and 0.5 s of host time between steps: its time above the bound
    is the extra steps' `a` each, the recomputed prompt, the host time, and no residual."""
    from tts.metrics.cost_model import above_bound, work_of

    lengths, prompt = [40, 30, 20], 50
    model = fit(sums_of(random_steps(random.Random(5), 200)))
    metrics = {"gen_tokens": sum(lengths) + 3, "gen_requests": 3, "gen_prompt_tokens": 3 * prompt,
               "gen_cached_tokens": 0, "beam_tokens": [max(lengths)]}
    steps = []
    for n in lengths:  # one at a time: a prefill (the first path's twice), then n decodes
        steps += [step(0, prompt)] * (2 if n == lengths[0] else 1) + [step(1)] * n
    sums = sums_of(steps)
    wall = sums.wall_s + 0.5
    work = work_of([metrics], (64, 4096))
    parts = above_bound(wall, work, {"generator": model, "verifier": None}, {"generator": sums})
    bound = work_bounds([metrics], model, None, (64, 4096))["gen_bound_s"]
    assert sum(parts.values()) == pytest.approx(wall - bound)
    assert parts["host_s"] == pytest.approx(0.5)
    assert parts["gen_steps_s"] == pytest.approx(A * (len(steps) - max(lengths)), rel=1e-6)
    assert parts["recomputed_s"] == pytest.approx(C * prompt - B * 0, rel=1e-6)  # the prompt computed again
    assert abs(parts["residual_s"]) < 1e-6 and parts["ver_steps_s"] == 0.0
    assert above_bound(wall, work, {"generator": None}, {"generator": sums}) is None  # worked, but no fit


def test_the_runs_tails_count_only_fewer_in_flight_after_each_passs_last_start():
    from tts.metrics.cost_model import tail_forfeit

    # two slots: a and b start at 0; c starts when a ends (4); b ends at 6, c at 10.
    # After c's start, 2 in flight until 6, then c alone for 4 s: half the slots empty.
    spans = [(0.0, 4.0), (0.0, 6.0), (4.0, 10.0)]
    assert tail_forfeit(spans, 2) == (4.0, 2.0)
    # with four slots, every second after the last start runs below the concurrency
    tail, forfeit = tail_forfeit(spans, 4)
    assert tail == 6.0 and forfeit == pytest.approx(2 * 2 / 4 + 4 * 3 / 4)
    # a gap with nothing in flight is no tail; each pass (a chunk, a seed) ends in its own
    assert tail_forfeit([(0.0, 1.0), (2.0, 3.0)], 2) == (2.0, 1.0)
    # two chunks of the example back to back, the second starting as the first ends
    assert tail_forfeit(spans + [(s + 10.0, e + 10.0) for s, e in spans], 2) == (8.0, 4.0)
    assert tail_forfeit(spans, 1) == (0.0, 0.0) and tail_forfeit([], 4) == (0.0, 0.0)


def test_the_busy_rate_counts_full_slot_time_and_credits_each_problem_its_share():
    from tts.metrics.cost_model import busy_rate

    # two slots: a (0-4) and b (0-6) fill them, c (4-10) takes a's: both full until b ends
    # at 6. a and b ran wholly in full-slot time, c a third of its span
    spans = [(0.0, 4.0), (0.0, 6.0), (4.0, 10.0)]
    busy, done = busy_rate(spans, 2)
    assert busy == 6.0 and done == pytest.approx(2 + 1 / 3)
    # with four slots none was ever full; one slot has no tails to leave out
    assert busy_rate(spans, 4) == (0.0, 0.0) and busy_rate(spans, 1) == (0.0, 0.0)
    # two passes back to back count twice
    busy, done = busy_rate(spans + [(s + 10.0, e + 10.0) for s, e in spans], 2)
    assert busy == 12.0 and done == pytest.approx(2 * (2 + 1 / 3))
