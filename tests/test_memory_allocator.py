"""Roofline-guided KV allocation: linear search vs brute force, ties, offload, policies."""

import random

import pytest

from tts.memory.allocator import Allocation, Workload, brute_force_allocation, search_allocation
from tts.memory.device import DeviceProfile, load_device
from tts.memory.policy import KVSplit, RooflineSplit, StaticSplit, make_allocation_policy
from tts.memory.roofline import ModelShape

SMOL = ModelShape(30, 576, 9, 3, 64, 1536, 49152, 2, 134_515_008)  # 23040 B/token
QWEN_1_5B = ModelShape(28, 1536, 12, 2, 128, 8960, 151936, 2, 1_543_714_304)  # 28672 B/token
H100 = load_device("h100")
# peak 1 GFLOP/s, bandwidth 1e18 B/s: every pass is compute-bound with exact power-of-two ratios.
SLOW_COMPUTE = DeviceProfile("slow", "gpu", peak_tflops=1e-3, bandwidth_gbs=1e9, memory_gb=1.0, source="test")


def random_shape(rng: random.Random) -> ModelShape:
    heads = rng.choice([2, 4, 8, 16, 32])
    head_dim = rng.choice([32, 64, 128])
    hidden = heads * head_dim
    layers = rng.randint(1, 48)
    inter = hidden * rng.choice([2, 3, 4])
    vocab = rng.randint(1000, 160_000)
    params = layers * (4 * hidden * hidden + 3 * hidden * inter) + vocab * hidden
    return ModelShape(layers, hidden, heads, rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0]),
                      head_dim, inter, vocab, rng.choice([2, 4]), params)


def random_device(rng: random.Random) -> DeviceProfile:
    return DeviceProfile("rand", rng.choice(["cpu", "gpu"]), peak_tflops=10 ** rng.uniform(-1, 3.3),
                         bandwidth_gbs=10 ** rng.uniform(1, 3.8), memory_gb=80.0, source="random")


def random_instance(rng: random.Random) -> tuple:
    gen, ver = random_shape(rng), random_shape(rng)
    workload = Workload(rng.randint(1, 40), rng.randint(1, 3000), rng.randint(1, 1500),
                        gen_context_len=rng.choice([0, rng.randint(0, 500)]),
                        block_size=rng.choice([1, 16, 32]))
    per_pair = workload.kv_verifier(ver) + workload.kv_generator(gen)
    budget = int(per_pair * rng.uniform(0.3, workload.num_requests + 3))  # infeasible .. ample
    overhead = rng.choice([None, 0.0, 10 ** rng.uniform(-4, 2)])
    return gen, ver, workload, budget, overhead


def test_linear_search_equals_brute_force_on_random_instances():
    rng = random.Random(1234)
    outcomes = {"none": 0, "split": 0, "offload": 0}
    for _ in range(200):
        gen, ver, workload, budget, overhead = random_instance(rng)
        device = random_device(rng) if rng.random() < 0.7 else load_device(rng.choice(["cpu", "rtx4090", "h200"]))
        fast = search_allocation(gen, ver, device, workload, budget, overhead)
        slow = brute_force_allocation(gen, ver, device, workload, budget, overhead)
        assert fast == slow, (gen, ver, device, workload, budget, overhead)
        outcomes["none" if fast is None else fast.mode] += 1
    assert min(outcomes.values()) > 0, outcomes  # every branch was exercised


def test_split_result_respects_the_budget():
    rng = random.Random(7)
    for _ in range(50):
        gen, ver, workload, budget, _ = random_instance(rng)
        alloc = search_allocation(gen, ver, H100, workload, budget)
        if alloc is not None:
            assert alloc.kv_bytes_verifier + alloc.kv_bytes_generator <= budget
            assert 1 <= alloc.b_pre <= workload.num_requests and 1 <= alloc.b_dec <= workload.num_requests
            assert alloc.t_total == pytest.approx(alloc.t_verifier + alloc.t_generator, rel=1e-12)


def test_infeasible_budget_returns_none():
    workload = Workload(8, 100, 50)
    one_each = 100 * SMOL.kv_bytes_per_token + 50 * QWEN_1_5B.kv_bytes_per_token
    assert search_allocation(QWEN_1_5B, SMOL, H100, workload, one_each - 1) is None
    assert search_allocation(QWEN_1_5B, SMOL, H100, workload, 0) is None
    alloc = search_allocation(QWEN_1_5B, SMOL, H100, workload, one_each)
    assert (alloc.b_pre, alloc.b_dec) == (1, 1)
    assert (alloc.kv_bytes_verifier, alloc.kv_bytes_generator) == (2_304_000, 1_433_600)


def test_kv_uses_each_models_own_shape():
    workload = Workload(4, 100, 50)
    assert workload.kv_verifier(SMOL) == 100 * 23040
    assert workload.kv_generator(QWEN_1_5B) == 50 * 28672
    blocked = Workload(4, 33, 50, gen_context_len=20, block_size=32)
    assert blocked.kv_verifier(SMOL) == 64 * 23040 and blocked.kv_generator(SMOL) == 96 * 23040
    assert blocked.mean_decode_ctx == 45.0


def test_ties_go_to_larger_b_dec_then_larger_b_pre():
    # Compute-bound with N=4: batches 1, 2 and 4 all give exactly the same stage times
    # (power-of-two scaling is exact), so (1,1), (1,2), (2,2), (1,4), (4,1)... all tie.
    workload = Workload(num_requests=4, verifier_seq_len=8, decode_len=8)
    k = workload.kv_verifier(SMOL)
    assert k == workload.kv_generator(SMOL)
    alloc = search_allocation(SMOL, SMOL, SLOW_COMPUTE, workload, 5 * k)
    assert alloc.t_total == brute_force_allocation(SMOL, SMOL, SLOW_COMPUTE, workload, 5 * k).t_total
    assert (alloc.b_pre, alloc.b_dec) == (1, 4)
    # With room for (2, 4) and (4, 2), B_dec still wins; B_pre then takes the larger batch.
    wide = search_allocation(SMOL, SMOL, SLOW_COMPUTE, workload, 6 * k)
    assert (wide.b_pre, wide.b_dec) == (2, 4) and wide.t_total == alloc.t_total
    assert wide == brute_force_allocation(SMOL, SMOL, SLOW_COMPUTE, workload, 6 * k)


def test_best_b_dec_may_sit_below_the_memory_boundary():
    # Memory-bound decode, N=10: the boundary allows 6, but 2 batches of 6 cost more than
    # 2 batches of 5. Eq. (1) alone would pick 6. The verifier KV (1000 tokens) leaves room
    # for one verifier request only.
    workload = Workload(num_requests=10, verifier_seq_len=1000, decode_len=16)
    budget = workload.kv_verifier(SMOL) + 6 * workload.kv_generator(SMOL)
    alloc = search_allocation(SMOL, SMOL, H100, workload, budget)
    assert (alloc.b_pre, alloc.b_dec) == (1, 5)
    assert alloc == brute_force_allocation(SMOL, SMOL, H100, workload, budget)


def test_offload_chosen_when_memory_tiny_and_overhead_small():
    workload = Workload(num_requests=64, verifier_seq_len=512, decode_len=256)
    budget = workload.kv_verifier(SMOL) + workload.kv_generator(QWEN_1_5B)  # split: only (1, 1)
    split = search_allocation(QWEN_1_5B, SMOL, H100, workload, budget)
    assert split.mode == "split" and (split.b_pre, split.b_dec) == (1, 1)
    alloc = search_allocation(QWEN_1_5B, SMOL, H100, workload, budget, offload_overhead_s=1e-3)
    assert alloc.mode == "offload"
    assert alloc.b_dec > 1 and alloc.t_total < split.t_total
    assert alloc.t_total == pytest.approx(alloc.t_verifier + alloc.t_generator + 1e-3)


def test_offload_not_chosen_when_overhead_huge():
    workload = Workload(num_requests=64, verifier_seq_len=512, decode_len=256)
    budget = workload.kv_verifier(SMOL) + workload.kv_generator(QWEN_1_5B)
    alloc = search_allocation(QWEN_1_5B, SMOL, H100, workload, budget, offload_overhead_s=1e6)
    assert alloc == search_allocation(QWEN_1_5B, SMOL, H100, workload, budget)


def test_offload_is_the_only_option_when_split_does_not_fit():
    workload = Workload(num_requests=8, verifier_seq_len=512, decode_len=256)
    budget = max(workload.kv_verifier(SMOL), workload.kv_generator(QWEN_1_5B))
    assert search_allocation(QWEN_1_5B, SMOL, H100, workload, budget) is None
    alloc = search_allocation(QWEN_1_5B, SMOL, H100, workload, budget, offload_overhead_s=5.0)
    assert alloc.mode == "offload" and alloc.t_total > 5.0


def test_workload_validation():
    with pytest.raises(ValueError, match="num_requests"):
        Workload(0, 10, 10)
    with pytest.raises(ValueError, match="gen_context_len"):
        Workload(1, 10, 10, gen_context_len=-1)


def test_make_allocation_policy_registry():
    assert isinstance(make_allocation_policy("static", gen_shape=SMOL, ver_shape=SMOL), StaticSplit)
    policy = make_allocation_policy("roofline", gen_shape=SMOL, ver_shape=SMOL, device=H100)
    assert isinstance(policy, RooflineSplit)
    with pytest.raises(ValueError, match=r"\['roofline', 'static'\]"):
        make_allocation_policy("greedy", gen_shape=SMOL, ver_shape=SMOL)
    with pytest.raises(ValueError, match="device"):
        make_allocation_policy("roofline", gen_shape=SMOL, ver_shape=SMOL)
    with pytest.raises(ValueError, match="fraction"):
        StaticSplit(SMOL, SMOL, fraction=1.0)


def test_static_split_literal():
    workload = Workload(num_requests=8, verifier_seq_len=100, decode_len=100)  # 2_304_000 B each
    split = StaticSplit(SMOL, SMOL, fraction=0.75).split(10_000_000, workload)
    assert split == KVSplit(7_500_000, 2_500_000, generator_max_seqs=3, verifier_max_seqs=1)
    assert StaticSplit(SMOL, SMOL, fraction=0.75).split(8_000_000, workload) is None  # verifier gets 2 MB
    big = StaticSplit(SMOL, SMOL).split(10**12, workload)
    assert (big.generator_max_seqs, big.verifier_max_seqs) == (8, 8)


def test_roofline_split_matches_search_and_fills_budget():
    workload = Workload(num_requests=64, verifier_seq_len=512, decode_len=256)
    budget = 2 * 10**9
    split = RooflineSplit(QWEN_1_5B, SMOL, H100).split(budget, workload)
    alloc = search_allocation(QWEN_1_5B, SMOL, H100, workload, budget)
    assert isinstance(split.allocation, Allocation) and split.allocation == alloc
    assert (split.generator_max_seqs, split.verifier_max_seqs) == (alloc.b_dec, alloc.b_pre)
    assert split.verifier_kv_bytes == alloc.kv_bytes_verifier
    assert split.generator_kv_bytes + split.verifier_kv_bytes == budget
    assert split.generator_kv_bytes >= alloc.kv_bytes_generator and not split.offload


def test_roofline_split_shortage_and_offload():
    workload = Workload(num_requests=8, verifier_seq_len=512, decode_len=256)
    budget = max(workload.kv_verifier(SMOL), workload.kv_generator(QWEN_1_5B))
    assert RooflineSplit(QWEN_1_5B, SMOL, H100).split(budget, workload) is None
    split = RooflineSplit(QWEN_1_5B, SMOL, H100, offload_overhead_s=0.1).split(budget, workload)
    assert split.offload and split.generator_kv_bytes == split.verifier_kv_bytes == budget


def test_runtime_replans_stay_within_the_engines_slots():
    """With M, vLLM's slots (max_num_seqs) are fixed when an engine starts, and the batch
    cap is re-planned as paths grow; every cap a re-plan chooses must fit those slots (at
    N=32 a re-plan on short paths chose 32 against 8 slots sized for the peak workload)."""
    from types import SimpleNamespace

    from tts.config.compose import compose, validate
    from tts.assembly.memory_split import RuntimeAllocator, initial_caps, plan_memory

    class Slots:
        def __init__(self, slots: int) -> None:
            self.slots, self.caps = slots, []

        def set_limits(self, batch_cap: int | None = None) -> None:
            assert 1 <= batch_cap <= self.slots, (batch_cap, self.slots)
            self.caps.append(batch_cap)

    for n in (8, 16, 32):
        cfg = validate(compose("compare", [f"search.n={n}", "optim=PMS"]))
        gen_spec, ver_spec = plan_memory(cfg, cfg.optim)
        gen, ver = Slots(gen_spec.max_num_seqs), Slots(ver_spec.max_num_seqs)
        first = initial_caps(cfg, gen_spec.kv_bytes, ver_spec.kv_bytes)
        gen.set_limits(first[0])
        ver.set_limits(first[1])
        replan = RuntimeAllocator(cfg, gen, ver, gen_spec.kv_bytes, ver_spec.kv_bytes)
        for beams in (n, n // 2, 4, 1):
            for tokens in (0, 40, 200, 512):
                replan([SimpleNamespace(token_ids=tuple(range(tokens)))] * beams)
        assert len(gen.caps) > 2 and max(gen.caps) <= gen_spec.max_num_seqs
