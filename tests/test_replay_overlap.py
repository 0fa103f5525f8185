"""`replay.overlap`: the replay priced as vLLM's asynchronous scheduling runs. A step costs
the larger of its model time and its host time instead of their sum, each request stopped
in a step decodes one more (late) token in the next step's batch, and every replayed
variant reports the model's busy share of the wall. Priced here with a chosen step model
and host time per step, so that every figure follows from them and none from this host."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tts.backends.prefix_cache import PrefixCache
from tts.config.compose import ConfigError, compose
from tts.metrics.cost_model import CostModel
from tts.replay import setup
from tts.replay.sim_engine import SimEngine, Slot
from tts.metrics.step_cost import FittedCost
from tts.replay.run import run_replay
from tts.results.store import RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=2", "search.n=4",
        "search.beam_width=2", "search.max_iterations=5", "bench.warmup=0"]
VARIANTS = ["baseline", "PMS_branches_prune"]
GEN = {"step_s": 0.01, "per_decode_seq_s": 0.001, "per_prefill_token_s": 0.0, "steps": 10, "r2": 1.0}
VER = {"step_s": 0.005, "per_decode_seq_s": 0.0, "per_prefill_token_s": 0.0, "steps": 10, "r2": 1.0}
HOST = (0.004, 0.001, 0.0)  # per generator step, per verifier step, per iteration: below each step's cost


def recorded(tmp_path, *extra, name="rec"):
    """A fake run whose steps the replay prices with `GEN` and `VER` (its fit replaced)."""
    path = run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}",
                                               f"bench.compare=[{','.join(VARIANTS)}]", *extra]))
    summary = json.loads((path / "summary.json").read_text())
    summary["cost_model"] = {"generator": GEN, "verifier": VER}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def trees(path):
    return {(r["variant"], r["problem_id"]): [(c["text"], c.get("score")) for c in r["candidates"]]
            for r in RunStore(path).records()}


def rows(log: dict) -> int:
    """The sequences a model's steps ran, all steps together."""
    return round(log["running_mean"] * log["steps"])


def test_a_late_token_is_one_more_decode_sequence_in_the_next_steps_batch():
    cost = FittedCost(CostModel(**GEN))
    eng = SimEngine(cost, PrefixCache(4, 100), 4, 64, 100)
    eng.waiting.append(Slot(list(range(8))))
    eng.step()  # its prefill
    sampled, seconds, tokens = eng.step(late=[12, 30])
    assert len(sampled) == 1 and tokens == (1, 1, 1)  # it decodes, the two late ones decode beside it
    assert seconds == pytest.approx(cost.step_s([9, 12, 30], []))
    assert eng.step()[1] == pytest.approx(cost.step_s([10], []))  # priced once


def test_overlap_hides_the_host_behind_the_steps_and_prices_the_late_tokens(tmp_path, monkeypatch):
    """Off (the default for a run recorded without overlap) each step costs its model time
    plus the host time; on, the larger of the two, and each stopped request's late token
    is one more decode sequence in the next step: the same trees, the same steps, as many
    more sequences as late tokens, each priced at the step model's per-sequence cost. The
    model's busy share (both models' step time over the wall) rises."""
    path = recorded(tmp_path)
    monkeypatch.setattr(setup.ReplayBackends, "host_parts", lambda self: HOST)
    off = RunStore(run_replay(path, [], tmp_path / "off")).summary()
    on_path = run_replay(path, ["replay.overlap=true"], tmp_path / "on")
    on = RunStore(on_path).summary()
    assert trees(on_path) == trees(path)
    assert (off["host"]["overlap"], on["host"]["overlap"]) == (False, True)
    gen_host, ver_host, _ = HOST
    for name in VARIANTS:
        a, b = off["variants"][name], on["variants"][name]
        late = b["gen_late_tokens"]
        assert late > 0 and "gen_late_tokens" not in a
        assert b["generator"]["steps"] == a["generator"]["steps"]
        assert rows(b["generator"]) - rows(a["generator"]) == late
        model = {s: {m: x[m]["cost"]["wall_s"] for m in ("generator", "verifier")} for s, x in (("off", a), ("on", b))}
        assert model["on"]["generator"] - model["off"]["generator"] == pytest.approx(late * GEN["per_decode_seq_s"])
        # the time each model's calls took: steps plus host off, the steps alone on (host below each step)
        for m, host in (("generator", gen_host), ("verifier", ver_host)):
            assert a[m]["model_s"] == pytest.approx(model["off"][m] + host * a[m]["cost"]["steps"])
            assert b[m]["model_s"] == pytest.approx(model["on"][m])
        for s, x in (("off", a), ("on", b)):
            assert x["model_busy_share"] == pytest.approx(sum(model[s].values()) / x["wall_s"])
        assert b["model_busy_share"] > a["model_busy_share"]
    table = on["simulated"]["against_recorded_md"]
    assert "| baseline | model busy share (both models' step time / wall time) |" in table


def test_the_replay_overlaps_as_the_recorded_run_did_unless_told(tmp_path):
    """Without `replay.overlap`, a run recorded with overlap replays with it and one
    recorded without (every run before the option) without it; the option wins over
    either, and takes true or false only."""
    from tts.results.host import simulated_line

    plain = recorded(tmp_path, name="plain")
    lagged = recorded(tmp_path, "generator.overlap=on", name="lagged")
    assert RunStore(run_replay(plain, [], tmp_path / "a")).summary()["host"]["overlap"] is False
    as_recorded = RunStore(run_replay(lagged, [], tmp_path / "b")).summary()["host"]
    assert as_recorded["overlap"] is True and ", overlap;" in simulated_line(as_recorded)
    told = RunStore(run_replay(lagged, ["replay.overlap=false"], tmp_path / "c")).summary()["host"]
    assert told["overlap"] is False and told["options"]["overlap"] is False
    assert ", overlap;" not in simulated_line(told)
    with pytest.raises(ConfigError, match=r"replay.overlap: 'maybe'; valid choices: true, false"):
        run_replay(plain, ["replay.overlap=maybe"])


def test_the_gpu_overlap_check_prices_each_row_as_the_replay_does(tmp_path):
    """`docs/gpu/overlap_check.py` (run on a card, with torch alone) compares the wall it
    times with the replay's price: model + host one after the other, max(model, host)
    overlapped. Its `--dry` run on this CPU checks the script runs and prices every row
    so; the timings themselves are the card's (docs/gpu/overlap_check_h200.md)."""
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(repo / "docs/gpu/overlap_check.py"), "--dry", "--out", str(tmp_path)],
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(repo)})
    rows = json.loads((tmp_path / "overlap_check.json").read_text())["rows"]
    assert {r["overlap"] for r in rows} == {False, True}
    for r in rows:
        expected = max(r["model_ms"], r["host_ms"]) if r["overlap"] else r["model_ms"] + r["host_ms"]
        assert r["price_ms"] == pytest.approx(expected)
        assert r["busy_share"] == pytest.approx(r["model_ms"] / r["wall_ms"])
    assert "| overlapped: wall (ms) |" in (tmp_path / "overlap_check.md").read_text()
