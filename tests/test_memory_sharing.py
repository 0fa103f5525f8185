"""M under memory pressure: a prefix that paths share is sized once, and each engine's
batch cap is re-planned within the KV that engine holds (#38)."""

from types import SimpleNamespace

import pytest

from tts.memory.allocator import Workload, search_caps
from tts.memory.device import load_device

from tests.test_memory_allocator import SMOL, random_device, random_shape

BLOCK = 32


def tree(prompt: int, parents: int, children: int, path: int, last_step: int = 0) -> list:
    """`parents` paths of `path` tokens after one prompt of `prompt` tokens, each forked
    into `children` beams with the same context (a beam search's requests); with
    `last_step`, the path's last step was that many tokens long."""
    from tts.search.tree import Step, StepEnd

    steps = (Step(tuple(range(last_step)), "x", StepEnd.BOUNDARY),) if last_step else ()
    beams = []
    for p in range(parents):
        ids = tuple(range(prompt)) + tuple(10_000 * (p + 1) + t for t in range(path))
        beams += [SimpleNamespace(token_ids=ids, steps=steps)] * children
    return beams


def test_context_blocks_counts_a_shared_prefix_once():
    from tts.assembly.memory_split import context_blocks

    # prompt: 2 full blocks, shared by all 8; each parent's path adds 1 full block and a
    # 16-token tail (not a full block: vLLM caches full blocks only); 4 children per parent
    assert context_blocks(tree(64, 2, 4, 48), BLOCK) == (2 + 2) / 8
    # independent paths: only the prompt is shared
    assert context_blocks(tree(64, 8, 1, 48), BLOCK) == (2 + 8) / 8
    # same tokens in a different prefix are a different block (vLLM hashes the prefix)
    a = SimpleNamespace(token_ids=tuple(range(32)) + (7,) * 32)
    b = SimpleNamespace(token_ids=tuple(range(1, 33)) + (7,) * 32)
    assert context_blocks([a, b], BLOCK) == 2.0


def test_a_shared_context_is_sized_once_and_none_keeps_the_paper_sizing():
    paper = Workload(8, verifier_seq_len=300, decode_len=64, gen_context_len=250, block_size=BLOCK)
    assert paper.kv_generator(SMOL) == 320 * SMOL.kv_bytes_per_token  # 7 full blocks + 26-token tail + 64
    assert paper.kv_verifier(SMOL) == 320 * SMOL.kv_bytes_per_token
    # the same context, each request holding a quarter of its 7 full blocks on its own
    shared = Workload(8, verifier_seq_len=300, decode_len=64, gen_context_len=250, block_size=BLOCK,
                      context_blocks=7 / 4)
    assert shared.kv_generator(SMOL) == (7 / 4 * 32 + 96) * SMOL.kv_bytes_per_token
    assert shared.kv_verifier(SMOL) == (7 / 4 * 32 + 96) * SMOL.kv_bytes_per_token  # tail 26 + 50 new
    # when nothing is shared, the two agree
    unshared = Workload(8, verifier_seq_len=300, decode_len=64, gen_context_len=250, block_size=BLOCK,
                        context_blocks=7)
    assert (unshared.kv_generator(SMOL), unshared.kv_verifier(SMOL)) == (paper.kv_generator(SMOL),
                                                                       paper.kv_verifier(SMOL))
    with pytest.raises(ValueError, match="context_blocks"):
        Workload(8, 300, 64, gen_context_len=250, context_blocks=-1)
    with pytest.raises(ValueError, match="gen_context_len"):
        Workload(8, 100, 64, gen_context_len=250, context_blocks=1)


def test_caps_within_each_engines_kv_are_the_best_pairs_that_fit():
    """`search_caps` against every (B_pre, B_dec) pair that fits each engine's own bytes:
    the least modelled time, ties to the larger B_dec, then the larger B_pre."""
    import random

    from tts.memory.allocator import evaluate_allocation

    rng = random.Random(3)
    for _ in range(60):
        gen, ver, device = random_shape(rng), random_shape(rng), random_device(rng)
        workload = Workload(rng.randint(1, 24), rng.randint(200, 2000), rng.randint(1, 200),
                            gen_context_len=rng.randint(0, 200), block_size=16,
                            context_blocks=rng.choice([None, rng.uniform(0, 12)]))
        gen_kv = rng.randint(1, 30) * workload.kv_generator(gen) + rng.randint(0, 999)
        ver_kv = rng.randint(1, 30) * workload.kv_verifier(ver) + rng.randint(0, 999)
        alloc = search_caps(gen, ver, device, workload, gen_kv, ver_kv)
        n = workload.num_requests
        pairs = [(bp, bd) for bp in range(1, n + 1) for bd in range(1, n + 1)
                 if bp * workload.kv_verifier(ver) <= ver_kv and bd * workload.kv_generator(gen) <= gen_kv]
        best = min(pairs, key=lambda p: (evaluate_allocation(gen, ver, device, workload, *p).t_total, -p[1], -p[0]))
        assert (alloc.b_pre, alloc.b_dec) == best
    assert search_caps(SMOL, SMOL, load_device("h100"), Workload(4, 64, 64), 1, 1) is None


def test_runtime_caps_count_siblings_once_and_stay_in_each_engines_kv():
    """The pressure cell where PM ran at 0.58x the paper's baseline (docs/runs/history.md): the
    re-plan split the whole budget as if each child held its parent's path alone, and gave
    the generator 6 running requests (the baseline ran 12) and the verifier 1."""
    from tts.config.compose import compose, validate
    from tts.assembly.memory_split import RuntimeAllocator, context_blocks, kv_bytes_per_token, plan_memory
    from tts.kv_budget import kv_budget

    class Engine:
        def __init__(self) -> None:
            self.caps = []

        def set_limits(self, batch_cap: int | None = None) -> None:
            self.caps.append(batch_cap)

    cfg = validate(kv_budget(compose("pressure", ["search.n=32", "memory.working_set_fraction=0.12",
                                                  "optim=PM"])))
    gen_spec, ver_spec = plan_memory(cfg, cfg.optim)
    held = {"gen": gen_spec.kv_bytes // kv_bytes_per_token(cfg.generator),
            "ver": ver_spec.kv_bytes // kv_bytes_per_token(cfg.verifier)}
    step = cfg.generator.step_max_tokens

    def caps(beams):
        gen, ver = Engine(), Engine()
        RuntimeAllocator(cfg, gen, ver, gen_spec.kv_bytes, ver_spec.kv_bytes)(beams)
        return gen.caps[-1], ver.caps[-1]

    siblings, alone = tree(160, 8, 4, 128), tree(160, 32, 1, 128)
    shared, independent = caps(siblings), caps(alone)
    # what each request holds: its share of the full context blocks, then tail and step in blocks
    for beams, (b_dec, b_pre) in ((siblings, shared), (alone, independent)):
        own = context_blocks(beams, 32) * 32 + (288 % 32 + step + 31) // 32 * 32
        assert b_dec * own <= held["gen"] and b_pre * own <= held["ver"]
    paper = held["gen"] // ((288 + step + 31) // 32 * 32)  # each child sized for its whole context
    assert shared[0] >= 2 * paper and shared[0] > independent[0] >= paper
    assert shared[1] >= 4  # the verifier keeps a batch within its own KV
    # steps that stopped at 20 tokens: a step is sized by what the last iteration drew
    drawn = caps(tree(160, 8, 4, 128, last_step=20))
    assert drawn[0] > shared[0] and drawn[1] >= shared[1]


def test_a_step_is_sized_by_the_steps_the_last_iteration_drew():
    from tts.assembly.memory_split import last_step_tokens
    from tts.search.tree import Step, StepEnd

    def beam(*lengths):
        return SimpleNamespace(steps=tuple(Step(tuple(range(k)), "x", StepEnd.BOUNDARY) for k in lengths))

    assert last_step_tokens([], 96) == 96  # before the first step: the limit
    assert last_step_tokens([beam(), beam()], 96) == 96
    assert last_step_tokens([beam(50, 20), beam(7, 31)], 96) == 26  # the last steps' mean, rounded up
    assert last_step_tokens([beam(50, 20), beam(7, 32)], 96) == 26
    assert last_step_tokens([beam(0)], 96) == 1
    assert last_step_tokens([beam(120)], 96) == 96  # never above the limit


def test_the_replans_are_kept_for_the_step_logs():
    from tts.config.compose import compose, validate
    from tts.assembly.memory_split import RuntimeAllocator

    class Engine:
        def set_limits(self, batch_cap: int | None = None) -> None:
            self.cap = batch_cap

    cfg = validate(compose("pressure", ["search.n=32", "optim=PM"]))
    allocator = RuntimeAllocator(cfg, Engine(), Engine(), 2_000 * 46080, 1_500 * 46080)
    for beams in (tree(160, 8, 4, 0), tree(160, 8, 4, 0), tree(160, 8, 4, 128, last_step=20)):
        allocator(beams)
    summary = allocator.summary()
    assert summary["replans"] == 2  # the same caps twice are one re-plan
    first, last = summary["history"]
    assert first["beams"] == last["beams"] == 32 and last["step_tokens"] == 20
    own = (160 // 32) / 32 + (288 // 32 - 160 // 32) / 4  # the prompt's blocks over 32 paths, the path's over 4
    assert last["context_tokens"] == 288 and last["own_context_blocks"] == round(own, 2)
    assert (last["b_dec"], last["b_pre"]) != (first["b_dec"], first["b_pre"])

