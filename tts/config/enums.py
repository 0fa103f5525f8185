"""The enumerated choices of the config schemas (`tts.config.schema`)."""

from __future__ import annotations

import enum


class Algorithm(str, enum.Enum):
    """The built-in search algorithms' names, the keys of their registry (`tts.search.POLICIES`,
    which also names a user's own); `search.algorithm` is a string, so it can name those too."""

    beam = "beam"
    dvts = "dvts"
    best_of_n = "best_of_n"
    self_consistency = "self_consistency"
    dynamic_branching = "dynamic_branching"
    varying_granularity = "varying_granularity"


class Aggregation(str, enum.Enum):
    last = "last"
    min = "min"
    prod = "prod"
    mean = "mean"


class Adapter(str, enum.Enum):
    judge = "judge"
    math_shepherd = "math_shepherd"
    rlhflow = "rlhflow"
    skywork = "skywork"
    qwen_prm = "qwen_prm"


class BackendKind(str, enum.Enum):
    vllm = "vllm"
    fake = "fake"


class Sampler(str, enum.Enum):
    """How a seeded generator request draws its random numbers.

    position: from (seed, absolute position), so a request resumed from part of its output,
    or run on past a step boundary, samples what a fresh request with that seed would, as
    long as its logits are the same: in float32, or with batch-invariant kernels
    (speculative steps are then reused exactly; `tts.backends.vllm.sampling`).
    vllm: vLLM's own per-request generator, started at the request's first sampled token
    (on CPU tts keeps that stream whole through chunked prefills, which vLLM 0.32 alone
    cannot: `tts.backends.vllm.internals.keep_seeded_streams`).
    auto: position where the generator runs float32 (or vLLM's batch-invariant kernels),
    vllm elsewhere (bf16: the logits move with the batch, so exactness cannot hold).
    """

    auto = "auto"
    position = "position"
    vllm = "vllm"


class Overlap(str, enum.Enum):
    """Whether an engine's host work overlaps its model's next step (vLLM's asynchronous
    scheduling, `step_with_batch_queue`: each `step()` returns the step before's outputs).

    on: asynchronous scheduling; a request tts stops has one more token computed and thrown
    away (its late token, counted in the summary). vLLM runs it on CUDA only: `on` where the
    models run on a CPU is a config error (vLLM would switch it off silently). On the fake
    backend, `on` is its one-step-lag mode (`FakeGenerator(lag=True)`), for tests.
    off: synchronous scheduling, each `step()` returns its own batch's tokens.
    auto: on where the models run on CUDA (`tts.backends.factory.models_on_cuda`), but for a
    verifier with a reward head (vLLM's pooling runner, which vLLM itself keeps synchronous:
    asynchronous scheduling slows pooling); off elsewhere.
    """

    auto = "auto"
    on = "on"
    off = "off"


class BenchMode(str, enum.Enum):
    search = "search"  # run the search variants over the problems (the default)
    ceiling = "ceiling"  # time the generator path against raw vLLM (tts.benchmarks.ceiling)


class VariantOrder(str, enum.Enum):
    interleaved = "interleaved"  # every variant a round of problems, the order reversed each round (A B, B A)
    sequential = "sequential"  # every variant in the listed order, a chunk at a time


class EngineKind(str, enum.Enum):
    baseline = "baseline"
    flash = "flash"
    decoupled = "decoupled"


class DecoupledPolicy(str, enum.Enum):
    eager_first = "eager_first"
    speculative_first = "speculative_first"
    adaptive = "adaptive"


class DecoupledSpecScope(str, enum.Enum):
    survivors = "survivors"  # the children selection would keep, judged on the scores known so far
    all = "all"  # child 0 of every generated beam (the thesis's speculation)


class LookaheadScope(str, enum.Enum):
    auto = "auto"  # all for a PRM that reads a whole path per request; none where the verifier
    # makes a request per score (judge, rlhflow): there lookahead saves no work (tts/engine/barrier.py)
    all = "all"  # every beam's whole speculative step, in the call that scores its current one (the paper's)
    kept = "kept"  # only the beams selection keeps on the new scores, in a second verifier call


class DatasetName(str, enum.Enum):
    embedded = "embedded"
    math500 = "math500"
    aime24 = "aime24"
    amc23 = "amc23"
