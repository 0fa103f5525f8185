"""The host-time split (`tts.results.host_time`): the backend's request calls and each
selection are timed where they run, and the summary's parts add up to the host time.

On a virtual clock that only the test moves, every figure is exact: a request call that
takes 1 ms and a selection that takes 10 ms are counted as exactly that, however the
engine interleaves them with steps."""

import pytest

from tts import clock
from tts.backends.fake import FakeGenerator, FakeVerifier, endless_script
from tts.config.enums import Algorithm
from tts.config.schema import SearchConfig
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.metrics.cost_model import COST, CostSums
from tts.results.host_time import add_host_time
from tts.results.ratios import RATIO_METRICS
from tts.search import make_policy

ADD_S, ABORT_S, SELECT_S = 0.001, 0.002, 0.01


class SlowCalls(FakeGenerator):
    """A fake generator whose request calls take known virtual time."""

    def __init__(self, vclock: clock.VirtualClock, **kw) -> None:
        super().__init__(endless_script, **kw)
        self.vclock, self.adds, self.aborts = vclock, 0, 0

    def _add(self, request) -> None:
        self.vclock.advance(ADD_S)
        self.adds += 1
        super()._add(request)

    def _abort(self, request_ids) -> None:
        self.vclock.advance(ABORT_S)
        self.aborts += 1
        super()._abort(request_ids)


def slow_selection(vclock: clock.VirtualClock, cfg: SearchConfig):
    policy = make_policy(cfg, 30, 300)
    select = policy.select

    def timed(search, now):
        vclock.advance(SELECT_S)
        select(search, now)

    policy.select = timed
    return policy


@pytest.mark.parametrize("schedule,opts", [("barrier", {}), ("barrier", {"speculative": True}),
                                           ("decoupled", {"concurrency": 2, "speculative": True})])
def test_request_calls_and_selections_are_timed_exactly(schedule, opts):
    vclock = clock.VirtualClock()
    cfg = SearchConfig(algorithm=Algorithm.beam, n=4, beam_width=2, max_iterations=3)
    with clock.simulated(vclock):
        gen = SlowCalls(vclock, batch_cap=8)
        eng = Engine(gen, FakeVerifier(), lambda: slow_selection(vclock, cfg), "sys", EngineOptions(**opts),
                     schedule=schedule)
        outs = list(eng.run([ProblemInput(p, f"problem {p}") for p in ("a", "b")]))
    calls = eng.collector.logs["generator"].cost.calls_s
    assert calls == pytest.approx(ADD_S * gen.adds + ABORT_S * gen.aborts)
    assert gen.adds > 0 and calls > 0
    for out in outs:
        m = out.metrics
        assert m.select_s == pytest.approx(SELECT_S * m.iterations)
        assert m.select_max_s == pytest.approx(SELECT_S)


def _summary(wall=10.0, gen_steps=100, gen_wall=6.0, calls=0.5, ver_wall=2.0, ver_model=2.25):
    gen, ver = CostSums(steps=gen_steps, wall_s=gen_wall, calls_s=calls), CostSums(steps=5, wall_s=ver_wall)
    return {"wall_s": wall, "generator": {COST: gen.to_dict()}, "verifier": {COST: ver.to_dict(), "model_s": ver_model}}


def test_the_split_adds_up_to_the_host_time():
    records = [{"metrics": {"latency_s": 5.0, "iterations": 4, "select_s": 0.1, "select_max_s": 0.04,
                            "record_s": 0.15}},
               {"metrics": {"latency_s": 5.0, "iterations": 6, "select_s": 0.2, "select_max_s": 0.05,
                            "record_s": 0.05}}]
    s = _summary()
    s["generator"]["running_mean"] = 50.0  # 100 steps of 50 requests
    add_host_time(s, records)
    assert s["host_s"] == pytest.approx(10.0 - 6.0 - 2.0)
    assert s["host_share"] == pytest.approx(0.2)
    assert (s["host_backend_calls_s"], s["host_verifier_s"], s["host_select_s"], s["host_record_s"]) \
        == pytest.approx((0.5, 0.25, 0.3, 0.2))
    assert s["host_engine_s"] == pytest.approx(2.0 - 0.5 - 0.25 - 0.3 - 0.2)
    assert s["engine_per_gen_step_ms"] == pytest.approx(1000 * 0.75 / 100)
    assert s["host_per_gen_step_ms"] == pytest.approx(
        s["engine_per_gen_step_ms"] + s["backend_calls_per_gen_step_ms"] + s["verifier_host_per_gen_step_ms"]
        + s["select_per_gen_step_ms"] + s["record_per_gen_step_ms"])
    assert s["engine_per_request_us"] == pytest.approx(1e6 * 0.75 / 5000)
    assert s["host_per_request_us"] == pytest.approx(1e6 * 2.0 / 5000)
    assert s["select_ms_mean"] == pytest.approx(1000 * 0.3 / 10)
    assert s["select_ms_max"] == pytest.approx(50.0)
    keys = {k for k, *_ in RATIO_METRICS}
    assert {"host_share", "engine_per_gen_step_ms", "select_ms_mean"} <= keys


def test_an_old_run_without_the_timings_gets_no_selection_and_no_split_without_steps():
    records = [{"metrics": {"latency_s": 5.0, "iterations": 4}}]
    s = _summary()
    add_host_time(s, records)
    assert "select_ms_mean" not in s and s["host_select_s"] == 0.0
    s = _summary(gen_steps=0)
    add_host_time(s, records)
    assert "host_s" not in s


@pytest.mark.parametrize("schedule,opts", [("barrier", {"speculative": True}),
                                           ("barrier", {"spec_rule": "branches", "speculative": True}),
                                           ("decoupled", {"concurrency": 2, "speculative": True})])
def test_every_request_carries_its_prompts_key(schedule, opts):
    """The key each request carries, kept by its beam as steps were appended and children
    forked, is the hash of its prompt from the first token (what the trace records)."""
    from tts.token_hash import extend_hash

    cfg = SearchConfig(algorithm=Algorithm.beam, n=4, beam_width=2, max_iterations=4)
    gen = FakeGenerator(endless_script, batch_cap=8)
    seen = []
    gen.add_request_observer(seen.append, lambda ids: None)
    eng = Engine(gen, FakeVerifier(), lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts),
                 schedule=schedule)
    list(eng.run([ProblemInput(p, f"problem {p}") for p in ("a", "b")]))
    assert len(seen) > 8
    assert all(r.prompt_key == extend_hash(0, r.prompt_token_ids) for r in seen)


@pytest.mark.parametrize("concurrency,record_s", [(1, [0.5, 0.5, 0.5]), (3, [0.5, 0.75, 0.75])])
def test_recording_a_problem_is_timed_apart_from_the_engine(tmp_path, monkeypatch, concurrency, record_s):
    """Grading a finished problem's candidates and writing its record run while no model
    step does: each record carries that time (`metrics.record_s`), and the summary counts it
    apart from the engine's own work. On a virtual clock, a grading that takes 0.5 s is
    exactly 0.5 s of the record's; the writing of a record is in the wall time where more
    problems are in flight (it lands in the next record's), not where each problem runs on
    its own (one at a time, interleaved with the other variants: the variant's clock stops
    between its problems)."""
    from tts.bench import record as record_mod
    from tts.config.compose import compose
    from tts.results.store import RunStore
    from tts.runner import run_bench

    vclock = clock.VirtualClock()
    build = record_mod.build_record

    def slow_build(*a, **k):
        vclock.advance(0.5)
        return build(*a, **k)

    append = RunStore.append

    def slow_append(self, record):
        vclock.advance(0.25)
        return append(self, record)

    monkeypatch.setattr(record_mod, "build_record", slow_build)
    monkeypatch.setattr(RunStore, "append", slow_append)
    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
                             "search.beam_width=2", "search.max_iterations=3", "bench.compare=[baseline]",
                             "bench.warmup=0", f"bench.concurrency={concurrency}", f"bench.results_dir={tmp_path}",
                             "bench.run_name=r"])
    with clock.simulated(vclock):
        path = run_bench(cfg)
    store = RunStore(path)
    assert [r["metrics"]["record_s"] for r in store.records()] == pytest.approx(record_s)
    s = store.summary()["variants"]["baseline"]
    assert s["host_record_s"] == pytest.approx(sum(record_s))
    assert s["host_engine_s"] == pytest.approx(s["host_s"] - s["host_backend_calls_s"] - s["host_verifier_s"]
                                               - s["host_select_s"] - sum(record_s))


def test_the_engine_host_check_runs_the_engine_alone_and_splits_its_time(tmp_path):
    """`docs/gpu/engine_host_check.py` (for a GPU server's CPU: tts's Python alone, on the fake
    backend, no torch) runs the search with and without speculation and splits each run's wall
    into the fake models' time and the engine's own, per step and per running request."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(repo / "docs/gpu/engine_host_check.py"), "--out", str(tmp_path), "--n", "16",
                    "--iterations", "2", "--repeats", "1"], check=True, cwd=repo, capture_output=True,
                   env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    runs = json.loads((tmp_path / "engine_host_check.json").read_text())["runs"]
    assert [r["speculative"] for r in runs] == [False, True]
    for r in runs:
        assert r["generator_steps"] > 0 and 0 < r["running_per_step"] <= 16
        own_s = r["engine_ms_per_step"] * r["generator_steps"] / 1e3
        assert own_s + r["fake_models_ms_per_step"] * r["generator_steps"] / 1e3 == pytest.approx(r["wall_s"])
        assert r["engine_us_per_running_request"] == pytest.approx(
            1e6 * own_s / (r["running_per_step"] * r["generator_steps"]))
    assert "| engine ms/step |" in (tmp_path / "engine_host_check.md").read_text()
