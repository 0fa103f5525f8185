"""`tts bench` on a GPU host (CUDA mocked: its name and free memory), and engines released
between the variants of a compare run."""

from __future__ import annotations

import weakref

import pytest

from tts.config.compose import compose, validate

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=2", "search.n=4",
        "search.beam_width=2", "search.max_iterations=3"]


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA host whose card is named by `gpu.name` with `gpu.free` bytes free."""
    from tts.backends.vllm import engine

    class Card:
        name = "NVIDIA H100 80GB HBM3"
        free = 40 << 30

    monkeypatch.setattr(engine, "has_cuda", lambda: True)
    monkeypatch.setattr(engine, "gpu_name", lambda: Card.name)
    monkeypatch.setattr(engine, "gpu_free_bytes", lambda: Card.free)
    return Card


@pytest.mark.parametrize("card, profile", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H200", "h200"),
])
def test_a_gpu_run_without_device_gets_its_cards_profile(gpu, card, profile) -> None:
    from tts.profiling.host_device import on_this_host

    gpu.name = card
    cfg = on_this_host(compose("config", []))  # device: cpu, the default
    assert (cfg.device.name, cfg.device.kind) == (profile, "gpu")
    assert validate(compose("config", [f"device={profile}"])).device == validate(cfg).device


def test_a_device_given_is_kept_and_a_cpu_run_measures_its_cpu(gpu, monkeypatch) -> None:
    from tts.backends.vllm import engine
    from tts.profiling.host_device import on_this_host

    given = compose("config", ["device=a100"])
    assert on_this_host(given) is given  # a GPU profile named on the command line
    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    monkeypatch.setattr("tts.profiling.calibrate.host_profile", lambda p, dtype=None: (p, None))
    cpu = compose("config", [])
    assert on_this_host(cpu) is cpu


def test_an_unknown_card_runs_on_an_estimate_not_an_error(gpu, monkeypatch) -> None:
    """A card no profile describes (here a made-up name on the B200's properties) gets one
    estimated from its properties (tests/test_memory_gpus.py has its numbers), not an exit."""
    from tts.profiling.host_device import on_this_host
    from tts.memory.gpus import CardProperties

    gpu.name = "NVIDIA Made-Up 9000"
    monkeypatch.setattr("tts.profiling.gpu.card_properties",
                        lambda: CardProperties(gpu.name, 10, 0, 148, 191_000_000_000, 1_965_000, 3_996_000, 8192))
    monkeypatch.setattr("tts.profiling.gpu.kept_calibration", lambda card, cache=None: None)
    cfg = validate(on_this_host(compose("config", [])))
    assert (cfg.device.name, cfg.device.kind) == ("made_up_9000_estimate", "gpu")
    assert cfg.device.source.startswith("ESTIMATED from the card's own properties")


def test_the_kv_budget_comes_from_the_cards_free_memory(gpu) -> None:
    """memory=gpu: 90% of 40 GiB free, less two SmolLM2-135M engines in bf16, each 269,030,016
    bytes of weights and 1,360,003,072 of activations (8192 tokens x 5184 values x 2 bytes),
    logits (4 x 256 rows x 49152 x 4 bytes) and the 1 GiB reserve."""
    from tts.kv_budget import kv_on_this_gpu

    cfg = kv_on_this_gpu(compose("config", ["memory=gpu"]))
    assert cfg.memory.kv_cache_gib * 2**30 == pytest.approx(int(0.9 * (40 << 30)) - 2 * (269_030_016 + 1_360_003_072))
    fixed = compose("config", ["memory=gpu", "memory.gpu_free_fraction=null"])
    assert kv_on_this_gpu(fixed) is fixed  # null: kv_cache_gib, on a GPU too
    gpu.free = 3 << 30
    with pytest.raises(ValueError, match=r"memory.gpu_free_fraction=0.9: 2.70 GiB of the GPU's 3.00 GiB free leave "
                                         r"no KV cache after the models' weights \(0.50 GiB\) and activations"):
        kv_on_this_gpu(compose("config", ["memory=gpu"]))


def test_the_cpu_keeps_its_kv_budget(monkeypatch) -> None:
    from tts.backends.vllm import engine
    from tts.kv_budget import kv_on_this_gpu

    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    cfg = compose("config", ["memory=gpu"])
    assert kv_on_this_gpu(cfg) is cfg and cfg.memory.kv_cache_gib == 8.0


def test_engines_are_released_before_the_next_variants_are_built(tmp_path, monkeypatch) -> None:
    """Variants whose engines differ (here: each variant's batch slots) get new engines,
    built only once the previous variant's are closed and collected: no reference is left
    in the runner, the engine, the collector, the records or a closure."""
    import tts.assembly.build
    from tts.backends.factory import Backends, EngineSpec
    from tts.runner import run_bench

    specs = iter(range(8, 100))
    monkeypatch.setattr(tts.assembly.build, "static_split", lambda cfg: (EngineSpec(1 << 20, next(specs)),
                                                                 EngineSpec(1 << 20, next(specs))))
    built: list[weakref.ref] = []
    events: list[str] = []

    def recording(make):
        def wrapper(self, spec):
            events.append(f"build with {sum(ref() is not None for ref in built)} alive")
            backend = make(self, spec)
            built.append(weakref.ref(backend))
            return backend
        return wrapper

    # fake engines hold no memory, so a fake run skips the collection; here they stand in for vLLM's
    monkeypatch.setattr(Backends, "_real", lambda self: True)
    monkeypatch.setattr(Backends, "_make_generator", recording(Backends._make_generator))
    monkeypatch.setattr(Backends, "_make_verifier", recording(Backends._make_verifier))
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.compare=[baseline,PMS,P]"])
    run_bench(cfg)
    # each variant's turn that needs new engines (3 variants interleaved over 3 problems):
    # generator then verifier; the previous turn's pair is gone by then
    assert len(events) >= 6 and events == ["build with 0 alive", "build with 1 alive"] * (len(events) // 2)
    assert all(ref() is None for ref in built)  # and the last pair once the run closes


def test_release_empties_the_cuda_cache_on_a_gpu(monkeypatch) -> None:
    import torch

    from tts.backends import factory
    from tts.backends.vllm import engine

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(engine, "has_cuda", lambda: False)
    factory.release_memory()
    monkeypatch.setattr(engine, "has_cuda", lambda: True)
    factory.release_memory()
    assert emptied == [True]


@pytest.mark.vllm
def test_a_replaced_vllm_engine_is_collected_before_the_next_starts(monkeypatch) -> None:
    """The same through real vLLM (SmolLM2-135M on CPU): the closed engine's `vllm.LLM` is
    gone, not merely shut down, when the next variant's engine is built."""
    pytest.importorskip("vllm")
    from tts.backends.factory import Backends, EngineSpec
    from tts.models.cache import ModelNotPresentError
    from tts.models.resolve import resolve_model

    try:
        resolve_model("smollm2-135m-instruct")
    except ModelNotPresentError as err:
        pytest.skip(str(err))
    import logging

    # pytest's log capture keeps every record, and a record of an exception (a plugin that
    # fails to load while the engine starts) keeps its traceback's frames, `LLM.__init__`
    # with its `self` among them: a run's handlers keep none
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    backends = Backends(validate(compose("config", ["verifier=fake", "generator.dtype=float32"])))
    first, _ = backends.get(EngineSpec(128 << 20, 8), None)
    old = weakref.ref(first.llm)
    del first
    seen = []
    make = Backends._make_generator
    monkeypatch.setattr(Backends, "_make_generator", lambda self, spec: seen.append(old() is None) or make(self, spec))
    try:
        backends.get(EngineSpec(128 << 20, 9), None)
    finally:
        backends.close()
    assert seen == [True]


def test_a_pass_runs_on_a_frozen_heap_without_automatic_collections(tmp_path, monkeypatch):
    """Each variant's pass runs on a collected, frozen heap (`settle_heap`, before its clock)
    with no automatic collection (`quiet_heap`): a step sees the collector off, and it is on
    afterwards. A cycle the previous pass left, frozen with it, is collected all the same,
    and so is one a pass makes (by the full collection after each problem's record)."""
    import gc

    import tts.bench.loop as loop
    from tts.backends.fake import FakeGenerator
    from tts.runner import run_bench

    class Cycle:
        pass

    left = Cycle()
    left.me = left
    gone = weakref.ref(left)
    gc.freeze()  # as an earlier pass would have frozen it
    del left
    seen: list[tuple[int, bool]] = []  # (freeze count, automatic collection on) at each step of a pass
    made: list[weakref.ref] = []
    step, run_variant, passes = FakeGenerator._step, loop.run_variant, []

    def in_pass(*args, **kwargs):  # a variant's pass (the warm-up before them is not one)
        passes.append(True)
        try:
            return run_variant(*args, **kwargs)
        finally:
            passes.pop()

    def observed(self):
        if not passes:
            return step(self)
        seen.append((gc.get_freeze_count(), gc.isenabled()))
        if len(made) < 3:  # a cycle the pass makes
            cycle = Cycle()
            cycle.me = cycle
            made.append(weakref.ref(cycle))
        return step(self)

    monkeypatch.setattr(FakeGenerator, "_step", observed)
    monkeypatch.setattr(loop, "run_variant", in_pass)
    assert gc.isenabled()
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.compare=[baseline,PMS]"])
    try:
        run_bench(cfg)
    finally:
        gc.unfreeze()
    assert seen and all(frozen > 0 and not automatic for frozen, automatic in seen)
    assert gc.isenabled()
    assert gone() is None and made and all(ref() is None for ref in made)
