"""Overlap (`generator.overlap`, vLLM's asynchronous scheduling) without a GPU: the fake
backend's one-step lag behaves as `EngineCore.step_with_batch_queue` does (outputs one step
behind, an empty first step, a stopped request's token in flight thrown away and counted
late), the engine grows the same trees under it, and the options resolve as documented."""

import json

import pytest

from tts.backends.base import FinishReason, GenRequest
from tts.backends.fake import EOS_CHAR, FakeGenerator, encode, prompt_text
from tts.config.compose import ConfigError, compose, validate
from tts.results.store import RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
        "search.beam_width=2", "search.max_iterations=5", "bench.warmup=0"]


def bench(tmp_path, *extra, name="run"):
    return run_bench(compose("config", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra]))


def trees(path):
    return {(r["variant"], r["problem_id"]): [(c["text"], c.get("score")) for c in r["candidates"]]
            for r in RunStore(path).records()}


def stepped(gen: FakeGenerator, steps: int, abort_after: dict[int, list[str]] | None = None):
    """`steps` steps of `gen`: each step's (request id, text, finish) and its stats, with the
    aborts of `abort_after[k]` after step k and their late tokens."""
    out, late = [], {}
    for k in range(steps):
        deltas, stats = gen.step()
        out.append(([(d.request_id, gen.decode(d.new_token_ids), d.finish_reason) for d in deltas], stats))
        if k in (abort_after or {}):
            late[k] = gen.abort(abort_after[k])
    return out, late


def two_requests(lag: bool) -> FakeGenerator:
    """Request "e" writes "ab" and EOS; "n" runs to its max_tokens of 3 ("abc")."""
    gen = FakeGenerator(lambda problem, steps, seed: "abc" if seed else "ab" + EOS_CHAR, lag=lag)
    prompt = tuple(gen.encode_prompt("p", "s"))
    gen.add(GenRequest("e", prompt, max_tokens=10, seed=0))
    gen.add(GenRequest("n", prompt, max_tokens=3, seed=1))
    return gen


def test_the_lag_returns_each_step_one_step_late_and_an_eos_costs_one_late_token():
    """Without the lag, step k returns batch k; with it, step k returns batch k-1 (the first
    none), the same tokens in the same order. A request ending at EOS is scheduled once more
    before its EOS comes back (a late token, in the step that returns the EOS); one ending at
    its max_tokens is not (vLLM's scheduler knows the count ahead)."""
    sync, _ = stepped(two_requests(False), 4)
    lagged, _ = stepped(two_requests(True), 5)
    assert [d for d, _ in lagged] == [[]] + [d for d, _ in sync]
    assert [d for d, _ in sync][2] == [("e", EOS_CHAR, FinishReason.EOS), ("n", "c", FinishReason.LENGTH)]
    assert [s.late_tokens for _, s in sync] == [0, 0, 0, 0]
    assert [s.late_tokens for _, s in lagged] == [0, 0, 0, 1, 0]  # the EOS's extra row, nothing for the length stop
    assert [s.num_running for _, s in lagged] == [2, 2, 2, 1, 0]
    gen = two_requests(True)
    stepped(gen, 4)
    assert gen.num_unfinished() == 0


def test_an_abort_drops_the_token_in_flight_and_counts_it_late():
    """Aborted after the step that returned its first token, a request's second token is
    already computed: it is dropped (never returned) and the abort says one late token; a
    request aborted before it was ever scheduled costs none."""
    _, late = stepped(two_requests(False), 3, {1: ["e"]})
    assert late == {1: 0}
    gen = two_requests(True)
    out, late = stepped(gen, 4, {1: ["e"]})
    assert late == {1: 1}
    assert [rid for deltas, _ in out for rid, *_ in deltas].count("e") == 1  # its first token only
    gen.add(GenRequest("w", tuple(encode(prompt_text("p", "s"))), max_tokens=3, seed=1))
    assert gen.abort(["w"]) == 0


VARIANTS = ["baseline", "PMS_branches_prune", "PMS_exact"]


def test_overlap_grows_the_same_trees_and_counts_its_late_tokens(tmp_path):
    """With the fake's one-step lag (`generator.overlap=on`), the baseline, PMS_branches_prune
    and PMS_exact grow the trees they grow without it, text for text, and each variant's
    late tokens are every row its steps computed that no delta returned: the steps'
    scheduled requests less the tokens generated (none without the lag)."""
    from tts.results.host import host_line

    compare = f"bench.compare=[{','.join(VARIANTS)}]"
    off = bench(tmp_path, compare, name="off")
    on = bench(tmp_path, compare, "generator.overlap=on", name="on")
    assert trees(on) == trees(off) and len(trees(on)) == 3 * len(VARIANTS)
    for path, overlap in ((off, False), (on, True)):
        summary = json.loads((path / "summary.json").read_text())
        for variant in VARIANTS:
            s = summary["variants"][variant]
            rows = round(s["generator"]["running_mean"] * s["generator"]["steps"])
            assert rows - s["total_gen_tokens"] == s.get("gen_late_tokens", 0) == s["generator"]["late_tokens"]
            assert (s["generator"]["late_tokens"] > 0) is overlap, variant
        assert summary["host"]["overlap"] == {"generator": overlap, "verifier": False}
        assert ("overlap generator" in host_line(summary["host"])) is overlap
        late_rows = [r for r in summary["ratios"] if r.get("key") == "gen_late_tokens"]
        assert len(late_rows) == overlap  # a row where there are late tokens, none where there are none
    late_row = next(r for r in json.loads((on / "summary.json").read_text())["ratios"] if r.get("key") == "gen_late_tokens")
    assert all(late_row[v] > 0 for v in VARIANTS)


def test_overlap_on_where_vllm_cannot_run_it_is_one_line(monkeypatch, tmp_path):
    """vLLM switches asynchronous scheduling off on a CPU (`vllm/platforms/cpu.py`): asking
    for it there is refused in one line naming the field, before any model loads; `auto`
    is on where the models run on CUDA, but for a reward-head verifier."""
    from tts.backends import factory
    from tts.backends.vllm import engine

    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    cfg = validate(compose("config", ["generator.overlap=on"]))
    with pytest.raises(ConfigError, match=r"^generator.overlap=on: .*CUDA only.*use generator.overlap=auto or off$"):
        run_bench(compose("config", ["generator.overlap=on", f"bench.results_dir={tmp_path}"]))
    assert factory.overlaps(validate(compose("config", []))) == {"generator": False, "verifier": False}
    monkeypatch.setattr(engine, "has_cuda", lambda: True)
    assert factory.overlaps(cfg) == {"generator": True, "verifier": True}
    skywork = validate(compose("config", ["verifier=skywork_1.5b"]))
    assert factory.overlaps(skywork) == {"generator": True, "verifier": False}  # vLLM keeps pooling synchronous
    off = validate(compose("config", ["generator.overlap=off", "verifier.overlap=on", "verifier=skywork_1.5b"]))
    assert factory.overlaps(off) == {"generator": False, "verifier": True}
    # the fake runs no model: its lag only where asked for
    assert factory.overlaps(validate(compose("config", ["generator=fake", "verifier=fake"]))) == {
        "generator": False, "verifier": False}
