"""The replay's simulated engine (`tts.replay.sim_engine`) against real vLLM (CPU).

The same requests, a beam search's rounds on a KV pool too small for them, run through a
real engine (SmolLM2-135M, float32, 28 blocks of 32 tokens) and then through a `SimEngine`
fed the tokens the real one produced: the simulated engine must preempt as often as vLLM's
scheduler did, take as many steps, and evict and recompute as many blocks as vLLM's block
pool did (`ThrashCounter`). Half the requests are sent twice (the same prompt and seed, so
the same tokens): vLLM holds each copy's decoded blocks apart and caches both, and a
simulation that shares them by their tokens preempts far less than vLLM does (2 against
15), one that caches a hash once evicts half as often (22 against 50).
"""

from __future__ import annotations

import random

import pytest

from tts.models.cache import is_present

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not is_present("smollm2-135m-instruct"),
                                 reason="default model not pulled (tts models pull smollm2-135m-instruct)")]

BLOCK, BLOCKS, SEQS, ROUNDS, N, M = 32, 28, 16, 3, 16, 4
TOKEN_BYTES = 30 * 3 * 64 * 2 * 4  # SmolLM2-135M's KV per token in float32


def beam_rounds(llm) -> tuple[list[list[tuple[list[int], list[int]]]], int]:
    """ROUNDS rounds of N requests: N/M kept paths, each sent M times, every pair of them
    with one seed; each request aborted after its own number of tokens (as a step boundary
    stops it). Returns each round's (prompt, tokens) and vLLM's steps."""
    from vllm import SamplingParams

    from tts.backends.vllm.internals import token_prompt

    rng, engine, rounds, steps, rid = random.Random(1), llm.llm_engine, [], 0, 0
    paths = [[rng.randrange(100, 40_000) for _ in range(70)]] * N
    for _ in range(ROUNDS):
        lengths = [length for length in (rng.randrange(16, 72) for _ in range(N // 2)) for _ in range(2)]
        sent = {}
        for i, (path, length) in enumerate(zip(paths, lengths)):
            params = SamplingParams(max_tokens=100, ignore_eos=True, temperature=1.0, seed=rid + i // 2)
            engine.add_request(str(rid + i), token_prompt(llm, list(path)), params)
            sent[str(rid + i)] = (path, length)
        rid += N
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens = list(out.outputs[0].token_ids)
                if out.request_id not in done and len(tokens) >= sent[out.request_id][1]:
                    done[out.request_id] = tokens[:sent[out.request_id][1]]
                    engine.abort_request([out.request_id])
            steps += 1
        rounds.append([(sent[r][0], done[r]) for r in sent])
        kept = rng.sample(range(N), N // M)
        paths = [list(rounds[-1][i][0]) + rounds[-1][i][1] for i in kept for _ in range(M)]
    return rounds, steps


def simulate(rounds) -> tuple[dict[str, int], int]:
    """The same rounds through a `SimEngine` of the same pool: its counters and steps."""
    from tts.replay.sim_engine import SimEngine, Slot

    class Free:
        def step_s(self, *_):
            return 0.0

    engine, steps = SimEngine.of_pool(Free(), BLOCK, BLOCKS, SEQS, 4096), 0
    for requests in rounds:
        left = {}
        for prompt, tokens in requests:
            slot = Slot(list(prompt))
            engine.waiting.append(slot)
            left[id(slot)] = list(tokens)
        while left:
            sampled, _, _ = engine.step()
            for slot in sampled:
                slot.ids.append(left[id(slot)].pop(0))
                if not left[id(slot)]:
                    del left[id(slot)]
                    engine.release(slot)
            steps += 1
    return engine.cache.counts(), steps


def test_the_simulated_engine_preempts_and_evicts_as_vllm_does_where_sequences_decode_the_same_tokens():
    from tts.backends.vllm.engine import make_llm
    from tts.backends.vllm.internals import shutdown_llm
    from tts.backends.vllm.thrash import ThrashCounter
    from tts.models.resolve import resolve_model

    llm = make_llm(str(resolve_model("smollm2-135m-instruct")), kv_cache_bytes=BLOCKS * BLOCK * TOKEN_BYTES,
                   gpu_memory_utilization=None, block_size=BLOCK, max_num_seqs=SEQS, max_num_batched_tokens=4096,
                   dtype="float32", seed=0, min_tokens_per_seq=512)
    try:
        counter = ThrashCounter.attach(llm)
        rounds, real_steps = beam_rounds(llm)
        real = counter.counts()
    finally:
        shutdown_llm(llm)
    twins = sum(r[i] == r[i + 1] for r in rounds for i in range(0, N, 2))
    assert twins >= N  # the workload holds sequences that decode the same tokens
    sim, sim_steps = simulate(rounds)
    assert real["preemptions"] >= 10 and real["evictions"] >= 20  # the pool runs short
    assert abs(sim["preemptions"] - real["preemptions"]) <= 1, (sim, real)
    assert abs(sim_steps - real_steps) <= real_steps // 50, (sim_steps, real_steps)
    assert abs(sim["evictions"] - real["evictions"]) <= real["evictions"] // 10, (sim, real)
    assert abs(sim["thrash_blocks"] - real["thrash_blocks"]) <= 1, (sim, real)
