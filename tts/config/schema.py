"""Typed config schemas, one dataclass per config group, registered in Hydra's ConfigStore.

Every YAML under `conf/<group>/` is merged onto these schemas, so a misspelt key or a
value of the wrong type fails at composition, and `validate()` (which instantiates the
dataclasses, running each `__post_init__`) rejects values that are well typed but
invalid, naming the field and the valid choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from tts.config.enums import (
    Adapter, Aggregation, Algorithm, BackendKind, BenchMode, DatasetName, DecoupledPolicy, DecoupledSpecScope,
    EngineKind, LookaheadScope, Overlap, Sampler, VariantOrder)
from tts.config.record_for import RecordFor
from tts.config.shard import parse_shard
from tts.memory.device import StepEfficiency


def _require(cond: bool, field_name: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{field_name}: {msg}")


@dataclass
class GeneratorConfig:
    """The policy model that proposes reasoning steps."""

    model: str = "smollm2-135m-instruct"  # registry key (`tts models list`) or a local HF folder
    backend: BackendKind = BackendKind.vllm  # `fake` only for tests of engine logic
    # auto: the model's dtype, but float32 on a CPU without native bf16 (see resolve_dtype)
    dtype: str = "auto"
    temperature: float = 0.8
    top_p: float = 1.0
    sampler: Sampler = Sampler.auto  # see Sampler: position where exactness can hold
    overlap: Overlap = Overlap.auto  # see Overlap: vLLM's asynchronous scheduling, on where CUDA runs it
    step_max_tokens: int = 96  # a step ends at "\n\n", EOS, or this many tokens
    max_total_tokens: int = 768  # per path, prompt excluded; the path completes at this length
    system_prompt_file: str = "step_by_step.txt"  # under conf/prompts/, or an absolute path
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        _require(self.step_max_tokens >= 1, "generator.step_max_tokens", "must be >= 1")
        _require(self.max_total_tokens >= self.step_max_tokens, "generator.max_total_tokens",
                 f"{self.max_total_tokens} is below generator.step_max_tokens ({self.step_max_tokens}): a path "
                 "holds at least one whole step. A run config's max_total_tokens (e.g. compare.yaml's) applies "
                 f"to whichever generator is chosen; set generator.max_total_tokens={self.step_max_tokens} (or more) "
                 f"or generator.step_max_tokens={self.max_total_tokens} (or less)")
        _require(0.0 <= self.temperature, "generator.temperature", "must be >= 0")
        _require(0.0 < self.top_p <= 1.0, "generator.top_p", "must be in (0, 1]")
        _require(self.dtype in ("bfloat16", "float16", "float32", "auto"), "generator.dtype",
                 "valid choices: bfloat16, float16, float32, auto")


@dataclass
class VerifierConfig:
    """The process reward model that scores steps."""

    model: str = "smollm2-135m-instruct"
    backend: BackendKind = BackendKind.vllm
    adapter: Adapter = Adapter.judge  # how a step score is read from the model
    dtype: str = "auto"  # as generator.dtype
    judge_prompt_file: str = "judge.txt"  # for the `judge` adapter, under conf/prompts/
    overlap: Overlap = Overlap.auto  # as generator.overlap (auto: off for a reward head)

    def __post_init__(self) -> None:
        _require(self.dtype in ("bfloat16", "float16", "float32", "auto"), "verifier.dtype",
                 "valid choices: bfloat16, float16, float32, auto")


@dataclass
class SearchConfig:
    """The search algorithm: which beams expand, and which survive."""

    # a built-in's name (Algorithm), an installed package's entry point, or module:attribute
    # (a user's own; tts.config.plugins), checked against the registry (`tts.search`) at composition
    algorithm: str = Algorithm.beam.value
    n: int = 8  # candidates per iteration (beam, dvts) or samples (best_of_n, self_consistency)
    beam_width: int = 4  # M: children per kept beam; N/M beams are kept
    max_iterations: int = 40
    aggregation: Aggregation = Aggregation.last  # path score from step scores
    filter_duplicates: bool = False  # drop candidates whose text equals another's
    sort_completed: bool = True  # final N completed beams: top-scored (True) or first N
    # dynamic_branching: children per kept beam proportional to its score (total stays N)
    # varying_granularity: step limit by depth, and verification every k steps
    early_step_max_tokens: int = 64
    early_steps: int = 3
    verify_every: int = 1
    temperature: float | None = None  # over generator.temperature (None: it); greedy.yaml: 0
    # best_of_n, self_consistency: draw the N samples k at a time (0: all at once); with
    # optim.early_exit, adaptive sampling that stops once the answers agree
    sample_wave: int = 0

    def __post_init__(self) -> None:
        self.algorithm = getattr(self.algorithm, "value", self.algorithm)  # `Algorithm.beam` given in code
        _require(self.n >= 1, "search.n", "must be >= 1")
        _require(self.temperature is None or self.temperature >= 0, "search.temperature", "must be >= 0 or null")
        _require(self.temperature != 0 or self.n == 1, "search.n",
                 f"n={self.n} greedy paths (search.temperature=0) would all be the same path; use n=1")
        _require(self.beam_width >= 1, "search.beam_width", "must be >= 1")
        _require(self.max_iterations >= 1, "search.max_iterations", "must be >= 1")
        _require(self.verify_every >= 1, "search.verify_every", "must be >= 1")
        _require(0 <= self.sample_wave <= self.n, "search.sample_wave", f"must be in [0, n={self.n}] (0: all at once)")
        _require(self.early_step_max_tokens >= 1, "search.early_step_max_tokens", "must be >= 1")


@dataclass
class MemoryConfig:
    """KV-cache budget and its split between generator and verifier."""

    kv_cache_gib: float = 1.0  # total KV budget of both engines, CPU RAM or GPU memory
    # on a GPU: the run takes this share of the card's free memory at start, and the KV budget
    # is that less both models' weights and each engine's activations and workspaces
    # (`memory_split.gpu_kv_budget`), written over kv_cache_gib in the run's config; null:
    # kv_cache_gib, on a GPU too. CPU runs and replays always use kv_cache_gib.
    gpu_free_fraction: float | None = None
    # KV budget as a share of the search's KV working set (`memory_split.working_set_bytes`); null: kv_cache_gib
    working_set_fraction: float | None = None
    generator_fraction: float = 0.5  # the generator's share without optim.roofline_memory (static split)
    block_size: int = 32  # vLLM CPU needs a multiple of 32
    generator_max_num_seqs: int = 64
    verifier_max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    offload_idle_model: bool = False  # extended mode: vLLM sleep mode (GPU only)
    # vLLM's enforce_eager for both engines and the ceiling: true = no CUDA graphs or compile;
    # null: true on CPU (compiling costs a minute an engine), false on a GPU (CUDA graphs)
    enforce_eager: bool | None = None

    def __post_init__(self) -> None:
        _require(self.kv_cache_gib > 0, "memory.kv_cache_gib", "must be > 0")
        _require(self.gpu_free_fraction is None or 0.0 < self.gpu_free_fraction <= 1.0,
                 "memory.gpu_free_fraction", "must be in (0, 1] or null")
        _require(self.working_set_fraction is None or self.working_set_fraction > 0,
                 "memory.working_set_fraction", "must be > 0 or null")
        _require(0.0 < self.generator_fraction < 1.0, "memory.generator_fraction", "must be in (0, 1)")
        _require(self.block_size % 32 == 0, "memory.block_size",
                 f"{self.block_size} is not a multiple of 32 (vLLM on CPU rejects it)")
        _require(self.generator_max_num_seqs >= 1, "memory.generator_max_num_seqs", "must be >= 1")
        _require(self.verifier_max_num_seqs >= 1, "memory.verifier_max_num_seqs", "must be >= 1")


@dataclass
class OptimConfig:
    """Engine and system optimisations; each FlashTTS optimisation is its own switch."""

    engine: EngineKind = EngineKind.baseline
    score_cache: bool = True  # never score the same step twice
    eos_at_depth_limit: bool = True  # last iteration samples to EOS instead of one step
    speculative: bool = False  # S: speculative beam extension
    lookahead: bool = False  # verify current + speculative step together
    # which beams' speculative steps lookahead scores: see LookaheadScope
    lookahead_scope: LookaheadScope = LookaheadScope.auto
    prefix_aware: bool = False  # P: siblings contiguous, parents in order
    request_order: str = "fifo"  # order without P: fifo (search-and-learn's) or random (seeded)
    roofline_memory: bool = False  # M: roofline-guided KV split
    spec_truncate_ratio: float = 0.85  # R: mean kept fraction of speculative tokens on duplicates
    spec_truncate_std: float = 0.1
    # a duplicate samples at least this many tokens of its own step (kept at most step -
    # this): without it a draw near 1 makes a clone selection keeps together. 0: Algorithm 1
    spec_own_min_tokens: int = 4
    # speculation's start rule (tts/engine/speculation/registry.py): runon (the paper's), branches
    # (child k's own step, child k's seed), scoped (decoupled), none; auto: runon on flash, scoped on decoupled
    spec_rule: str = "auto"
    spec_max_tokens: int = 0  # cap on speculative tokens per beam; 0 = generator.step_max_tokens
    # requests kept running while speculating: -1 = the decode roofline's ridge batch (beyond
    # it each sequence slows the stragglers), 0 = the batch cap (the paper's), N = at most N
    spec_batch_cap: int = -1
    # speculation pruning (ours): once the requests still decoding are down to the beams
    # selection keeps, score finished steps early (the score cache) and stop the speculation
    # of every beam that at least N/M others already outscore
    spec_prune: bool = False
    decoupled_policy: DecoupledPolicy = DecoupledPolicy.eager_first
    verifier_batch_size: int = 0  # decoupled: PRM items per call; 0 = no cap
    # decoupled: what speculation generates ahead of selection (see tts/engine/speculation/scoped.py)
    decoupled_spec_scope: DecoupledSpecScope = DecoupledSpecScope.survivors
    # decoupled: start no speculation while the run's cost model says it does not pay
    decoupled_spec_guard: bool = True
    # adaptive compute (ours; see tts/engine/adaptive.py): early exit when a problem's
    # answer settles, early rejection of beams whose partial step cannot make the cut
    early_exit: bool = False
    exit_top: int = 4  # best completed candidates compared (at most search.n / 2)
    exit_agree: float = 0.75  # share of them that must give equivalent answers
    exit_patience: int = 2  # consecutive iterations the agreement (or plateau) must hold
    exit_plateau: float = 0.0  # or: best path score gained less than this (0 = off)
    early_reject: bool = False
    reject_interval: int = 16  # generator steps between partial scorings
    reject_margin: float = 0.1  # rejected when `keep` others estimate above by more than this

    def __post_init__(self) -> None:
        _require(self.request_order in ("fifo", "random"), "optim.request_order",
                 f"{self.request_order!r}; valid choices: fifo, random")
        _require(0.0 <= self.spec_truncate_ratio <= 1.0, "optim.spec_truncate_ratio", "must be in [0, 1]")
        _require(self.spec_batch_cap >= -1, "optim.spec_batch_cap", "must be -1 (auto), 0 (batch cap) or >= 1")
        _require(self.spec_truncate_std >= 0.0, "optim.spec_truncate_std", "must be >= 0")
        _require(self.spec_own_min_tokens >= 0, "optim.spec_own_min_tokens", "must be >= 0")
        _require(self.spec_rule in ("auto", "none") or self.speculative or self.engine == EngineKind.decoupled,
                 "optim.spec_rule", "needs optim.speculative=true (or engine=decoupled)")
        _require(not (self.lookahead and not self.speculative), "optim.lookahead",
                 "needs optim.speculative=true (it verifies speculative steps)")
        _require(self.engine != EngineKind.baseline or not (self.speculative or self.prefix_aware),
                 "optim.engine", "speculative/prefix_aware need engine=flash (or decoupled)")
        _require(self.exit_top >= 1, "optim.exit_top", "must be >= 1")
        _require(0.0 < self.exit_agree <= 1.0, "optim.exit_agree", "must be in (0, 1]")
        _require(self.exit_patience >= 1, "optim.exit_patience", "must be >= 1")
        _require(self.exit_plateau >= 0.0, "optim.exit_plateau", "must be >= 0 (0 = off)")
        _require(self.reject_interval >= 1, "optim.reject_interval", "must be >= 1")
        _require(self.reject_margin >= 0.0, "optim.reject_margin", "must be >= 0")
        _require(not (self.early_reject and not self.score_cache), "optim.early_reject",
                 "needs optim.score_cache=true (steps finished early are scored into the cache)")
        _require(not (self.spec_prune and not (self.speculative and self.engine == EngineKind.flash)),
                 "optim.spec_prune", "needs optim.speculative=true and engine=flash (it prunes the barrier's speculation)")
        _require(not (self.spec_prune and not self.score_cache), "optim.spec_prune",
                 "needs optim.score_cache=true (steps finished early are scored into the cache)")


@dataclass
class DatasetConfig:
    """Which problems to run."""

    name: DatasetName = DatasetName.embedded
    path: str | None = None  # local JSONL; wins over hf_id
    hf_id: str | None = None
    split: str | None = None
    first_k: int | None = None
    levels: list[int] | None = None
    ids: list[str] | None = None
    random_k: int | None = None
    seed: int = 0
    embedded_size: int = 20  # problems generated for the embedded set

    def __post_init__(self) -> None:
        for name in ("first_k", "random_k"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"dataset.{name}", "must be >= 1 or null")


@dataclass
class DeviceConfig:
    """A device profile for the roofline cost model."""

    name: str = "cpu"
    kind: str = "cpu"
    peak_tflops: float = 1.0
    bandwidth_gbs: float = 10.0
    memory_gb: float = 24.0
    calibrated: bool = False
    source: str = ""
    host: str = ""  # a calibrated CPU profile's CPU (model, threads, dtype); another CPU measures its own
    efficiency: StepEfficiency | None = None  # a GPU's measured steps against its roofline: the replay's price

    def __post_init__(self) -> None:
        _require(self.kind in ("cpu", "gpu"), "device.kind", "valid choices: cpu, gpu")
        _require(min(self.peak_tflops, self.bandwidth_gbs) > 0, "device.peak_tflops, bandwidth_gbs", "must be > 0")


@dataclass
class LoggerConfig:
    """Weights & Biases logging; local results are always written."""

    wandb: bool = True
    mode: str | None = None  # online | offline | disabled; null: WANDB_MODE, else offline
    project: str = "tts"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None  # W&B group; null: a shard's is its folder's parent (tts.saved.merge)

    def __post_init__(self) -> None:
        _require(self.mode in (None, "online", "offline", "disabled"), "logger.mode",
                 "valid choices: online, offline, disabled, null")


@dataclass
class BenchConfig:
    """How a run is driven and where it writes."""

    mode: BenchMode = BenchMode.search
    concurrency: int = 1  # problems in flight; 1 = latency mode, more = throughput mode
    seed: int = 0
    # every problem runs under each seed, every variant, paired by (problem, seed); empty:
    # [seed]. A record carries its seed; a resume may add seeds.
    seeds: list[int] = field(default_factory=list)
    run_name: str | None = None  # folder name under results_dir; null: generated
    results_dir: str = "results"
    resume: bool = False
    compare: list[str] = field(default_factory=list)  # optim presets side by side (NAME@COPY: again, A/A)
    # `optim.KEY=VALUE` on top of every `compare` preset: the command line's `optim.*`
    optim_overrides: list[str] = field(default_factory=list)
    # more variants: the baseline engine with each `conf/search` preset at this run's
    # search.n (e.g. [best_of_n, self_consistency]), on the same problems and seeds: what the
    # tree search adds over sampling N paths, in the same accuracy table and paired tests
    search_variants: list[str] = field(default_factory=list)
    # a problem that starts with none in flight starts on empty prefix caches: its record does
    # not depend on what ran before it (a resume repeats it). Costs a system-prompt prefill
    fresh_cache_per_problem: bool = True
    # before the variants, time raw vLLM at the run's sequences in flight (search.n x
    # bench.concurrency) and one sequence's decode rate: each variant's generator phase and
    # goodput are reported against them (tts.benchmarks.ceiling.raw_generator)
    raw_generator: bool = False
    # problems per chunk, each run by every variant before the next (0: one chunk)
    chunk: int = 0
    # variants take turns round by round (a chunk; else one problem at concurrency 1), the
    # order reversed each round, so drift lands on none (tts.bench.rounds: rounds, in_turn)
    order: VariantOrder = VariantOrder.interleaved
    # problems the first variant runs once, unrecorded, before the first round: one-time
    # costs (kernels built per shape) must not land on the first variant alone. 0: none
    warmup: int = 1
    shard: str | None = None  # "I/K": shard I of K of the selected problems (tts.problems.shard_of)
    # the card and pair the engine's decisions are priced for while this host computes the
    # tokens (tts.assembly.card); all null: for this host
    record_for: RecordFor = field(default_factory=RecordFor)

    def __post_init__(self) -> None:
        _require(self.concurrency >= 1, "bench.concurrency", "must be >= 1")
        _require(self.chunk >= 0, "bench.chunk", "must be >= 0 (0: no chunks)")
        _require(self.warmup >= 0, "bench.warmup", "must be >= 0 (0: no warm-up)")
        if self.shard is not None:
            parse_shard(self.shard)
        _require(len(set(self.seeds)) == len(self.seeds), "bench.seeds", f"repeats a seed: {list(self.seeds)}")

    @property
    def run_seeds(self) -> list[int]:
        """The seeds every problem runs under: `seeds`, or `[seed]` when it is empty."""
        return list(self.seeds) or [self.seed]


@dataclass
class ProfileConfig:
    """Options of `tts profile-memory`."""

    splits: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.5, 0.7, 0.9])
    tight_split: float = 0.1  # generator fraction for the tight blocks-per-step trace (skipped: the tightest that runs)
    loose_split: float = 0.5
    num_problems: int = 2  # problems run at each split of the sweep
    calibrate: bool = False  # measure this CPU and write conf/device/cpu.yaml
    # problems in flight during each split's run (null: bench.concurrency); with all of
    # them in flight the live paths outgrow a small share, which is what the sweep shows
    concurrency: int | None = 2
    # the sweep's total KV budget in tokens of generator KV (bytes = tokens x the
    # generator's KV bytes per token at the dtype it runs in), so the curve does not move
    # with the dtype; null: memory.kv_cache_gib. 6144 tokens = 192 blocks of 32.
    kv_budget_tokens: int | None = 6144
    # caps that keep the sweep short (null: the run config's own value; never raised)
    search_n: int | None = 16
    step_max_tokens: int | None = 32
    max_total_tokens: int | None = 128
    max_iterations: int | None = 6


_CEILING_SAMPLERS = ("vllm", "position")


@dataclass
class CeilingConfig:
    """`bench.mode=ceiling` (`tts bench --config-name=ceiling`): the generator path timed
    against raw `vllm.LLM.generate` on the same requests (the dataset's first problem as
    the prompt, distinct seeds, EOS ignored so every path does equal work)."""

    batches: list[int] = field(default_factory=lambda: [1, 16, 64])  # requests run together
    new_tokens: int = 96  # tokens each request generates (EOS ignored)
    samplers: list[str] = field(default_factory=lambda: list(_CEILING_SAMPLERS))  # engine paths
    repeats: int = 3  # timed runs of each path per batch; medians are reported

    def __post_init__(self) -> None:
        _require(bool(self.batches) and all(b >= 1 for b in self.batches), "ceiling.batches",
                 "must be a non-empty list of batch sizes >= 1")
        _require(self.new_tokens >= 1, "ceiling.new_tokens", "must be >= 1")
        _require(self.repeats >= 1, "ceiling.repeats", "must be >= 1")
        bad = [x for x in self.samplers if x not in _CEILING_SAMPLERS]
        _require(bool(self.samplers) and not bad, "ceiling.samplers",
                 f"{bad or 'empty'}: valid choices: {', '.join(_CEILING_SAMPLERS)}")


@dataclass
class Config:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    ceiling: CeilingConfig = field(default_factory=CeilingConfig)


GROUPS: dict[str, type] = {"generator": GeneratorConfig, "verifier": VerifierConfig, "search": SearchConfig,
                           "memory": MemoryConfig, "optim": OptimConfig, "dataset": DatasetConfig,
                           "device": DeviceConfig, "logger": LoggerConfig}


def register_configs() -> None:
    """Register the root schema; every group YAML is merged onto its typed field."""
    ConfigStore.instance().store(name="tts_schema", node=Config)

