"""A run recorded for a card (`bench.record_for`, `tts.assembly.card`), on the fake backend:
its engine decides as the card would with the pair (speculation width, memory split, batch
caps, the KV budget in the pair's tokens, the speculation guard's step prices), so a replay
there keeps every variant to its recording; the replay's first line says what the trace
was recorded for; a killed and resumed recording replays as an uninterrupted one."""

import gzip

import pytest

from tts.assembly.card import CardStepPrice, card_config, in_run_tokens
from tts.backends.base import GenDelta, StepStats
from tts.backends.factory import GIB, Backends, static_split
from tts.config.compose import ConfigError, compose, validate
from tts.engine.options import VerifierShape
from tts.engine.speculation.guard import SpeculationGuard
from tts.metrics.measures import SpeculationLog
from tts.replay.run import run_replay
from tts.results.host import host_line
from tts.results.store import RunStore
from tts.runner import run_bench
from tts.trace.format import TRACE, read_trace

# conf/paper_fig12.yaml's card, pair, memory settings and variants, on the fake backend
FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset=embedded", "dataset.first_k=2", "search.n=8",
        "search.beam_width=2", "search.max_iterations=5"]
CARD = ["device=rtx4090", "generator=qwen2.5-math-7b", "verifier=skywork_1.5b"]
NO_CARD = ["bench.record_for.device=null", "bench.record_for.generator=null", "bench.record_for.verifier=null"]
PRESETS = compose("paper_fig12", FAKE).bench.compare


def bench(tmp_path, *extra, name="run"):
    return run_bench(compose("paper_fig12", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra]))


def replayed(path, *overrides, name="replay"):
    summary = RunStore(run_replay(path, [*CARD, *overrides], run_name=name)).summary()
    return summary, host_line(summary["host"])


def memory_of(path):
    """The recorded run's memory settings as overrides: a replay on another card than the
    one a run was recorded for takes memory=gpu's unless told."""
    return [f"memory.{k}={v}" for k, v in RunStore(path).saved_config()["memory"].items()
            if v is not None and k != "kv_cache_gib"]


def test_a_trace_recorded_for_a_card_replays_there_with_nothing_drawn(tmp_path):
    """Every variant of the paper's sweep, and the decoupled schedule, recorded for the RTX
    4090 with the 7B+1.5B pair: replayed there, making its own decisions, each keeps to its
    recording (the decoupled schedule's guard prices steps a little differently on the fake,
    whose prefix cache counts blocks of 4 tokens: at most 5% drawn). The same run recorded
    for no card took other decisions (the CPU's speculation width), and the replay says so."""
    path = bench(tmp_path, f"bench.compare=[{','.join(PRESETS)},decoupled]", "generator.sampler=vllm")
    summary, first = replayed(path)
    simulated = summary["simulated"]
    assert "recorded for this card and pair (rtx4090 with Qwen/Qwen2.5-Math-7B-Instruct + " in first
    assert simulated["provenance"]["status"] == "same"
    assert set(simulated["divergence"]) <= {"decoupled"}
    for name, counts in simulated["served"].items():
        assert counts["requests"] > 0 and counts["drawn_token_share"] <= 0.05 and counts["drawn_score_share"] <= 0.05
        if name != "decoupled":
            assert counts["drawn_tokens"] == counts["drawn_scores"] == counts["borrowed_tokens"] == 0, name
    uncarded = bench(tmp_path, f"bench.compare=[{','.join(PRESETS)}]", *NO_CARD, name="uncarded")
    summary, first = replayed(uncarded, *memory_of(path), name="uncarded-replay")
    assert "recorded for no card" in first
    on_card = read_trace(path / TRACE).provenance[0]["variants"]["PMS"]["spec_batch_cap"]
    assert on_card > 0  # the card's decode ridge batch for the 7B
    assert summary["simulated"]["provenance"]["options"]["PMS"]["spec_batch_cap"] == [0, on_card]  # 0: the batch cap


def test_a_trace_recorded_for_another_card_is_named_as_such(tmp_path):
    path = bench(tmp_path, "bench.compare=[paper_baseline]", "dataset.first_k=1", "bench.record_for.device=h100")
    assert read_trace(path / TRACE).header["record_for"]["device"] == "h100"
    _, first = replayed(path, *memory_of(path))
    assert "recorded for another card or pair (h100 with Qwen/Qwen2.5-Math-7B-Instruct + " in first
    assert "replayed on rtx4090 with" in first


def test_the_engines_hold_the_tokens_the_cards_would():
    """The KV budget is the card's for the pair (0.966 of its memory less the pair's weights
    and activations), and each engine here holds as many tokens as the pair's engine there:
    the 7B generator's half of the budget at 57,344 bytes a token (28 layers, 4 KV heads of
    128, bf16), in whole blocks of 32, held by the fake generator in blocks of 4."""
    from tts.assembly.memory_split import gpu_kv_budget
    from tts.kv_budget import kv_for_the_card

    cfg = validate(kv_for_the_card(compose("paper_fig12", FAKE)))
    card = card_config(cfg)
    assert (card.device.name, card.generator.model, card.generator.dtype) == (
        "rtx4090", "Qwen/Qwen2.5-Math-7B-Instruct", "bfloat16")
    assert cfg.memory.kv_cache_gib == pytest.approx(gpu_kv_budget(card, int(24e9)) / GIB, abs=1e-3)
    tokens = int(cfg.memory.kv_cache_gib * GIB * 0.5) // (32 * 57344) * 32
    assert tokens > 2048 + 1024
    gen_spec, ver_spec = static_split(card)
    gen, _ = Backends(cfg).get(in_run_tokens(cfg, card, "generator", gen_spec),
                               in_run_tokens(cfg, card, "verifier", ver_spec))
    assert gen.prefix_cache.capacity * gen.prefix_cache.block == tokens


def test_the_engine_decides_for_the_cards_verifier():
    """Recorded for the card, the engine decides as Skywork's value head would (lookahead's
    `auto` scope on, no early rejection), whatever verifier scores here (a per-score chat
    judge on a CPU host left lookahead off, and its replay on the card then asked for
    scores the trace never held); recorded for no card, as the run's own verifier would."""
    from tts.assembly.build import engine_options

    for shape, extra in ((VerifierShape(False, False), []), (None, NO_CARD)):
        cfg = compose("paper_fig12", FAKE + extra)
        assert engine_options(cfg, cfg.optim).verifier_shape == shape


def test_paper_baselines_split_on_the_card():
    """`paper_baseline` on the card is the paper's baseline: two vLLM engines, each with a
    static share of the memory (no roofline split, `memory.generator_fraction` 0.5), each
    holding its own weights and activations and half of the KV budget they leave, built as
    `build_engine` builds it. Search-and-learn's own split, half of the card for the
    generator's engine (its `gpu_memory_utilization` 0.5) and the rest for the PRM, cannot
    hold the 7B's weights on the 24 GB card, so it cannot be the paper's for this pair."""
    from tts.assembly.build import build_engine
    from tts.assembly.memory_split import kv_bytes_per_token, model_shape
    from tts.assembly.variants import variant_optims
    from tts.kv_budget import kv_for_the_card

    cfg = validate(kv_for_the_card(compose("paper_fig12", FAKE)))
    card = card_config(cfg)
    optim = dict(variant_optims(cfg))["paper_baseline"]
    assert not optim.roofline_memory and card.memory.generator_fraction == 0.5
    gen_spec, ver_spec = static_split(card)
    assert gen_spec.kv_bytes + ver_spec.kv_bytes == int(cfg.memory.kv_cache_gib * GIB)
    assert abs(gen_spec.kv_bytes - ver_spec.kv_bytes) <= 1
    engine = build_engine(cfg, optim, Backends(cfg))
    held = engine.runner.gen.prefix_cache.capacity * engine.runner.gen.prefix_cache.block
    assert held == in_run_tokens(cfg, card, "generator", gen_spec).kv_bytes // kv_bytes_per_token(cfg.generator)
    weights = model_shape(card.generator.model, card.generator.dtype).weight_bytes
    assert weights > 0.5 * 24e9  # search-and-learn's half of the card


def test_the_generators_steps_are_priced_on_the_card_and_the_guard_weighs_them():
    """A request's first delta prices its prompt's prefill less the cached tokens, later ones
    a decode at its context; the speculation guard fits the card's prices (`card_s`), not the
    fake's microseconds, which it would not judge."""
    seen = []

    class Cost:
        def step_s(self, decode, prefill):
            seen.append((list(decode), list(prefill)))
            return 0.02 + 0.001 * len(decode)

    price = CardStepPrice(Cost())
    price([GenDelta("a", (5,), None, 8, 20)], None)
    price([GenDelta("a", (6,), None), GenDelta("b", (7,), None, 0, 12)], None)
    price([GenDelta("a", (8,), None)], None)
    assert seen == [([], [(12, 8)]), ([21], [(12, 0)]), ([22], [])]

    def guard_after(card_s):
        guard = SpeculationGuard(SpeculationLog())
        for i in range(64):  # 10 real requests a step, beside 0 to 4 speculative ones
            running = 10 + i % 5
            guard.observe(StepStats(running, 0, running, 64, 4096, 0.1, 1e-5, (1,) * running,
                                    card_s=None if card_s is None else card_s(running)), 10)
        return guard.breakeven()

    assert guard_after(None) is None
    assert guard_after(lambda running: 0.02 + 0.001 * running) == pytest.approx(0.001 / (0.001 + 0.02 / 10), rel=0.05)


def test_bad_record_for_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"bench.record_for.device: 'rtx9090'; valid choices: a100, cpu, h100"):
        compose("config", ["bench.record_for.device=rtx9090"])
    with pytest.raises(ConfigError, match=r"bench.record_for.generator: 'qwen-7b'; valid choices: .*qwen2.5-math-7b"):
        compose("config", ["bench.record_for.device=rtx4090", "bench.record_for.generator=qwen-7b"])
    with pytest.raises(ConfigError, match="bench.record_for.device: null, yet a generator"):
        compose("config", ["bench.record_for.generator=qwen2.5-math-7b"])


def test_a_resumed_recording_replays_as_an_uninterrupted_one(tmp_path):
    """Recorded in chunks of one problem (`bench.chunk`), killed after the first with its
    trace's last member cut off, then resumed: the replay on the card serves every variant
    what it serves the uninterrupted run's, and draws nothing."""
    compare = "bench.compare=[paper_baseline,PMS]"
    killed = bench(tmp_path, compare, "dataset.first_k=1")
    raw = (killed / TRACE).read_bytes()
    (killed / TRACE).write_bytes(raw + gzip.compress(b'{"t":"s","k":"x","d":0,"r":0.5}\n')[:-9])
    resumed = bench(tmp_path, compare, "bench.resume=true")
    whole = bench(tmp_path, compare, name="whole")
    served = [replayed(path, name=f"{path.name}-replay")[0]["simulated"]["served"] for path in (resumed, whole)]
    assert served[0] == served[1]
    assert all(counts["drawn_tokens"] == counts["drawn_scores"] == 0 for counts in served[0].values())

    def trees(path):
        return {(r["variant"], r["problem_id"]): [c["text"] for c in r["candidates"]] for r in RunStore(path).records()}

    assert trees(resumed) == trees(whole)


def _texts(path):
    """Each variant's candidates, by problem, text for text."""
    out = {}
    for r in RunStore(path).records():
        out.setdefault(r["variant"], {})[r["problem_id"]] = sorted(c["text"] for c in r["candidates"])
    return out


def test_a_replay_serves_every_variant_one_variants_tree(tmp_path):
    """`replay.tree=paper_baseline`: PMS_branches_prune and PMS_exact, served the baseline's
    recording first, grow the baseline's tree (their candidates, text for text), where their
    own recordings grew others (the fake in bf16: a request's tokens move with the batch it
    is first scheduled in, and speculation changes the batches). PMS_exact's run-on goes on
    in the baseline's recording of the child's step (the position sampler), never in its own
    recording of another tree; what either draws is speculation the baseline never asked
    for (the children of beams it did not keep). Without the option each variant keeps to
    its own recording. A variant the trace does not hold is refused."""
    path = bench(tmp_path, "bench.compare=[paper_baseline,PMS_branches_prune,PMS_exact]", "generator.dtype=bfloat16",
                 "generator.sampler=position")
    recorded = _texts(path)
    assert recorded["PMS_branches_prune"] != recorded["paper_baseline"] != recorded["PMS_exact"]  # three trees
    assert _texts(run_replay(path, CARD, run_name="own")) == recorded
    tree = run_replay(path, [*CARD, "replay.tree=paper_baseline"], run_name="tree")
    assert _texts(tree)["PMS_branches_prune"] == _texts(tree)["PMS_exact"] == recorded["paper_baseline"]
    summary = RunStore(tree).summary()
    served = summary["simulated"]["served"]["PMS_branches_prune"]
    assert served["drawn_token_share"] <= 0.05 and served["drawn_score_share"] == 0
    assert "every variant served paper_baseline's recording first (replay.tree)" in host_line(summary["host"])
    with pytest.raises(ConfigError, match="replay.tree: 'PMS' is not a variant this trace recorded; valid choices: "
                                          "PMS_branches_prune, PMS_exact, paper_baseline"):
        run_replay(path, [*CARD, "replay.tree=PMS"], run_name="refused")
