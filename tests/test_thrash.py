"""Thrash counting inside vLLM's block pool (thesis Algorithm 1), on real vLLM (CPU).

Two tiny engines (SmolLM2-135M, block size 32, max_model_len 128): a tight pool of 8 blocks
(7 usable: one 100-token request takes 4) and a generous pool of 40. Prompts are raw token
ids, so that their blocks are known: each prompt is 100 tokens, 3 full blocks looked up.
"""

from __future__ import annotations

import pytest

from tts.models.cache import is_present

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                                 reason="default model not pulled (tts models pull smollm2-135m-instruct)")]

BLOCK_BYTES = 32 * 23040  # one 32-token block of SmolLM2-135M in bf16


def _engine(num_blocks: int):
    from tts.backends.vllm.engine import make_llm
    from tts.models.resolve import resolve_model

    return make_llm(str(resolve_model("smollm2-135m-instruct")), kv_cache_bytes=num_blocks * BLOCK_BYTES,
                    gpu_memory_utilization=None, block_size=32, max_num_seqs=4,
                    max_num_batched_tokens=256, dtype="bfloat16", seed=0, min_tokens_per_seq=128)


@pytest.fixture(scope="module")
def tight():
    from tts.backends.vllm.internals import shutdown_llm

    llm = _engine(8)
    yield llm
    shutdown_llm(llm)


@pytest.fixture(scope="module")
def generous():
    from tts.backends.vllm.internals import shutdown_llm

    llm = _engine(40)
    yield llm
    shutdown_llm(llm)


def prompt(i: int) -> list[int]:
    """100 tokens whose first block differs from every other prompt's."""
    return [1000 + 97 * i + j for j in range(100)]


def run(llm, ids: list[int]) -> list[int]:
    """Each prompt in turn (one request at a time); the cached prompt tokens of each."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0)
    out = []
    for i in ids:
        (result,) = llm.generate([TokensPrompt(prompt_token_ids=prompt(i))], params, use_tqdm=False)
        out.append(int(result.num_cached_tokens or 0))
    return out


@pytest.fixture
def counter_for():
    from tts.backends.vllm.thrash import ThrashCounter

    made = []

    def attach(llm):
        llm.reset_prefix_cache()  # every test starts from a cold cache
        made.append(ThrashCounter.attach(llm))
        return made[-1]

    yield attach
    for c in made:
        c.detach()


def test_cycled_prefixes_thrash_in_a_tiny_pool(tight, counter_for):
    c = counter_for(tight)
    cached = run(tight, [0, 1, 2, 0, 1, 2])
    assert cached == [0] * 6
    s = c.snapshot()
    # the third prompt evicts the first one's 3 blocks; from then on every prompt comes back
    # after its blocks were evicted: a miss on its first block, seen before -> thrash
    assert (s["lookups"], s["hits"], s["misses"]) == (6, 0, 6)
    assert s["thrash"] == 3 and s["thrash_blocks"] == 9
    assert s["seen"] == 9 and s["cached"] <= 6
    assert s["evictions"] >= 9
    assert s["thrash_rate"] == pytest.approx(0.5)


def test_repeated_prompt_after_eviction_thrashes_exactly_once(tight, counter_for):
    c = counter_for(tight)
    run(tight, [0, 1])
    assert c.thrash == 0 and c.evictions == 0  # two requests fit: nothing evicted yet
    run(tight, [2])
    assert c.evictions == 3  # the first prompt's 3 cached blocks made room
    run(tight, [0])
    assert (c.thrash, c.thrash_blocks, c.misses, c.hits) == (1, 3, 4, 0)


def test_generous_pool_hits_and_never_thrashes(generous, counter_for):
    c = counter_for(generous)
    cached = run(generous, [0, 1, 2, 0, 1, 2])
    assert cached == [0, 0, 0, 96, 96, 96]  # 3 blocks of 32 tokens reused per repeat
    s = c.snapshot()
    assert (s["thrash"], s["thrash_blocks"], s["evictions"]) == (0, 0, 0)
    # a full hit stops at vLLM's lookup limit (prompt length - 1), so no miss is looked up
    assert (s["lookups"], s["hits"], s["misses"]) == (6, 9, 3)
    assert s["hits"] * 32 == sum(cached)
    assert s["seen"] == s["cached"] == 9


def test_reset_is_not_counted_as_thrash(generous, counter_for):
    c = counter_for(generous)
    run(generous, [3])
    assert generous.reset_prefix_cache()
    run(generous, [3])
    assert (c.resets, c.thrash, c.misses, c.hits) == (1, 0, 2, 0)


def test_lookups_count_once_per_admission(tight, counter_for):
    """Four prompts at once: only one fits the pool, the others wait and are looked up again
    every step; like vLLM's own stats, only the lookup at admission counts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from tts.backends.vllm.thrash import BlockUsageTrace

    c = counter_for(tight)
    trace = BlockUsageTrace.attach(tight)
    try:
        tight.generate([TokensPrompt(prompt_token_ids=prompt(i)) for i in (4, 5, 6, 7)],
                       SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    finally:
        trace.detach()
    assert (c.lookups, c.misses, c.hits, c.thrash) == (4, 4, 0, 0)
    assert trace.num_blocks == 8
    assert trace.blocks and max(trace.blocks) == 4 and all(0 < b <= 7 for b in trace.blocks)


def test_detach_restores_the_engine_and_one_counter_per_pool(tight):
    from tts.backends.vllm.internals import find_scheduler
    from tts.backends.vllm.thrash import ThrashCounter

    manager = find_scheduler(tight).kv_cache_manager
    c = ThrashCounter.attach(tight)
    with pytest.raises(ValueError, match="already has a ThrashCounter"):
        ThrashCounter.attach(tight)
    c.detach()
    hooked = {"get_cached_block", "_insert_block_hash", "_maybe_evict_cached_block", "reset_prefix_cache"}
    assert not hooked & set(vars(manager.block_pool))
    assert not {"get_computed_blocks", "record_prefix_cache_stats"} & set(vars(manager))
    before = c.snapshot()
    run(tight, [8])
    assert c.snapshot() == {**before, "enabled": False}


def test_other_vllm_versions_are_refused(monkeypatch, caplog):
    import vllm

    from tts.backends.vllm.internals import UnsupportedVllmError
    from tts.backends.vllm.thrash import ThrashCounter

    monkeypatch.setattr(vllm, "__version__", "0.31.9")
    with pytest.raises(UnsupportedVllmError, match="0.31.9"):
        ThrashCounter.attach(object())
    c = ThrashCounter.attach(object(), strict=False)
    assert not c.enabled and "0.31.9" in c.reason
    assert c.snapshot()["thrash"] == 0 and c.snapshot()["enabled"] is False
