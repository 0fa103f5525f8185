"""The replay's backends for each variant: what serves the engine (the trace, read with the
recorded models' tokenizers), what each step costs (fitted or roofline), and how much
memory the simulated engines have (the memory config's KV budget over the simulated
models' KV bytes per token)."""

from __future__ import annotations

from dataclasses import asdict

from tts.backends.base import Generator, ScoreRequest, Verifier
from tts.backends.factory import EngineSpec
from tts.backends.fake import FakeCodec
from tts.clock import VirtualClock
from tts.config.limits import engine_length
from tts.config.compose import ConfigError
from tts.config.enums import BackendKind
from tts.config.schema import Config
from tts.metrics.cost_model import CostModel
from tts.metrics.step_cost import FittedCost, RooflineCost, StepCost
from tts.replay.backends import ReplayGenerator, ReplayVerifier
from tts.replay.served import ReplayCounts
from tts.replay.sim_engine import SimEngine
from tts.replay.reader import VariantReader
from tts.replay.sampler import StepSampler
from tts.trace.format import Trace


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    from tts.models.resolve import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(model)))


def _tokenizer_only(model: str):
    """A model's tokenizer without its weights: from its local folder when it is here, else
    the tokenizer files alone from the hub (fails at once offline)."""
    from transformers import AutoTokenizer

    from tts.models.cache import folder_problems, local_path
    from tts.models.registry import find_spec

    spec = find_spec(model)
    if spec is not None and not folder_problems(local_path(spec.key)):
        return AutoTokenizer.from_pretrained(str(local_path(spec.key)))
    return AutoTokenizer.from_pretrained(spec.hf_id if spec is not None else model)


class ReplayBackends:
    """`Backends` for a replay: the same `start_variant` / `get` / `close`."""

    def __init__(self, cfg: Config, recorded: Config, trace: Trace, summary: dict, options, clock: VirtualClock,
                 pricing: dict | None = None) -> None:
        self.cfg, self.recorded, self.trace, self.summary = cfg, recorded, trace, summary
        self.pricing = pricing  # the summary of `replay.cost_from`'s run, whose fit prices the steps
        self.options = options
        self.clock = clock
        fake = recorded.generator.backend is BackendKind.fake
        self.codec = FakeCodec() if fake else self._chat_codec(recorded.generator.model)
        self.eos_ids = frozenset(trace.header.get("eos") or self._eos_ids(recorded.generator.model))
        self.sampler = StepSampler(trace, self.codec.token_text, self.codec.decode, self.eos_ids)
        self.resumable = trace.header.get("sampler") == "position"
        self.tokenizer_note = "fake verifier"
        self.build, self.per_score, self.partial = self._verifier_prompts()
        self.costs = self._costs()
        # replay.overlap, else as the recorded generator ran (off for a run recorded before it was)
        recorded_overlap = ((summary.get("host") or {}).get("overlap") or {}).get("generator", False)
        self.overlap = bool(recorded_overlap if options.overlap is None else options.overlap)
        self.counts: dict[str, ReplayCounts] = {}
        self.readers: dict[str, VariantReader] = {}  # each variant served its own recording first
        recorded_variants = {g.variant for gens in trace.sent.values() for g in gens}
        if options.tree and options.tree not in recorded_variants:
            raise ConfigError(f"replay.tree: {options.tree!r} is not a variant this trace recorded; "
                              f"valid choices: {', '.join(sorted(recorded_variants))}")
        self.variant = ""

    def _eos_ids(self, model: str) -> tuple[int, ...]:
        """A trace written before its header held them: the tokenizer's EOS and the
        generation config's, as vLLM stops at both."""
        ids = [self.codec.eos_token_id]
        if self.recorded.generator.backend is BackendKind.vllm:
            import json

            from tts.models.resolve import resolve_model

            path = resolve_model(model) / "generation_config.json"
            extra = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
            ids += [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
        return tuple(ids)

    @staticmethod
    def _chat_codec(model: str):
        from tts.backends.codec import ChatCodec

        return ChatCodec(_tokenizer(model))

    def _verifier_prompts(self):
        """How the simulated verifier turns a score request into prompts (token ids): its
        adapter (one prompt per scored step for a judge, one per path for a value head),
        over its own tokenizer where that is here, else the recorded verifier's as a
        stand-in (`self.tokenizer_note` says which)."""
        v = self.cfg.verifier
        if BackendKind.fake in (v.backend, self.recorded.verifier.backend):  # a fake's steps: its prompts
            from tts.backends.fake import encode

            if v.backend is not BackendKind.fake:
                self.tokenizer_note = f"the recorded fake verifier's prompts standing in for {v.model}'s"
            return (lambda req: [encode(req.problem + "".join(req.steps[: max(req.indices) + 1]))]), False, True
        from tts.backends.adapters import make_adapter

        options = {"prompt_file": v.judge_prompt_file} if v.adapter.value == "judge" else {}
        adapter = make_adapter(v.adapter.value, self._verifier_tokenizer(), **options)

        def build(req: ScoreRequest) -> list:
            return [spec.token_ids for spec in adapter.build(req.problem, req.steps, req.indices)]

        return build, adapter.request_per_index, adapter.reads_partial_steps

    def _verifier_tokenizer(self):
        simulated, recorded = self.cfg.verifier.model, self.recorded.verifier.model
        self.tokenizer_note = f"verifier prompts tokenized by {simulated}'s own tokenizer"
        if simulated != recorded:
            try:
                return _tokenizer_only(simulated)
            except Exception as err:  # offline, gated, or not a tokenizer: the stand-in below
                self.tokenizer_note = (f"verifier prompts tokenized by the recorded verifier's tokenizer ({recorded}) "
                                       f"standing in for {simulated}'s ({type(err).__name__})")
        return _tokenizer(recorded)

    def cost_kind(self) -> str:
        if self.options.cost_from:
            return "fitted"
        if self.options.cost != "auto":
            return self.options.cost
        same = (self.cfg.device.name == self.recorded.device.name and self.cfg.device.kind == "cpu"
                and self.cfg.generator.model == self.recorded.generator.model
                and self.cfg.verifier.model == self.recorded.verifier.model)
        return "fitted" if same else "roofline"

    def _costs(self) -> dict[str, StepCost]:
        if self.cost_kind() == "fitted":
            fitted = (self.pricing or self.summary).get("cost_model") or {}
            out = {}
            for role in ("generator", "verifier"):
                if fitted.get(role):
                    out[role] = FittedCost(CostModel(**fitted[role]))
                elif role == "verifier":  # a verifier that reported no steps (the fake): free
                    out[role] = FittedCost(CostModel(0.0, 0.0, 0.0, steps=0, r2=0.0))
                else:
                    whose = f"replay.cost_from={self.options.cost_from}" if self.options.cost_from else "the recorded run"
                    raise ValueError(f"replay.cost=fitted: {whose} has no fitted generator step model")
            return out
        if self.cfg.generator.backend is BackendKind.fake:
            raise ValueError("replay.cost=roofline needs real model shapes; a fake-backend run replays with "
                             "replay.cost=fitted")
        from tts.assembly.memory_split import device_profile

        device, launch = device_profile(self.cfg), self.options.launch_ms / 1e3
        measured = self.options.step_costs == "measured"
        return {role: RooflineCost(self._shape(role), device, launch, measured) for role in ("generator", "verifier")}

    def _shape(self, role: str):
        from tts.assembly.memory_split import model_shape

        model = getattr(self.cfg, role)
        return model_shape(model.model, model.dtype)

    def host_parts(self) -> tuple[float, float, float]:
        """The engine's own time (Python: the host) as the recorded run measured it for this
        variant (else the mean over its variants), as (per generator step, per verifier step,
        per search iteration): the time inside generation phases beyond their model steps,
        inside verifier calls beyond theirs, and between the two (selection, statistics).
        All 0 with `replay.host=none`. A run recorded with overlap measured the same host
        work (outside its steps), so its parts are read alike; `replay.overlap` decides
        whether a step hides them (`ReplayGenerator`)."""
        if self.options.host == "none":
            return 0.0, 0.0, 0.0
        variants = self.summary.get("variants", {})
        parts = [host_parts(v) for v in variants.values()]
        if self.variant in variants:
            return host_parts(variants[self.variant])
        return tuple(sum(p[i] for p in parts) / len(parts) for i in range(3)) if parts else (0.0, 0.0, 0.0)

    def on_iteration(self, variant: str, problem_id: str, iterations: int) -> None:
        """After each search iteration (outside both models' timers): the host time between."""
        self.clock.advance(self.host_parts()[2])

    def start_variant(self, name: str) -> None:
        self.variant = name
        self.counts.setdefault(name, ReplayCounts())
        self.readers.setdefault(name, VariantReader(self.trace, name, self.options.tree))

    def _engine(self, role: str, spec: EngineSpec) -> SimEngine:
        m, g = self.cfg.memory, self.cfg.generator
        longest = engine_length(g)
        if getattr(self.cfg, role).backend is BackendKind.fake:
            blocks = 1 << 20
        else:
            blocks = max(1, spec.kv_bytes // (m.block_size * self._shape(role).kv_bytes_per_token))
        return SimEngine.of_pool(self.costs[role], m.block_size, blocks, spec.max_num_seqs,
                                 max(m.max_num_batched_tokens, longest))

    def get(self, gen_spec: EngineSpec, ver_spec: EngineSpec | None) -> tuple[Generator, Verifier | None]:
        counts, (gen_host, ver_host, _) = self.counts[self.variant], self.host_parts()
        reader = self.readers[self.variant]
        gen = ReplayGenerator(self.codec, self.eos_ids, reader, self.sampler, self._engine("generator", gen_spec),
                              self.clock, counts, gen_host, self.resumable, self.overlap)
        if ver_spec is None:
            return gen, None
        ver = ReplayVerifier(self.build, reader, self.sampler, self._engine("verifier", ver_spec), self.clock,
                             counts, ver_host, self.per_score, self.partial, self.overlap)
        return gen, ver

    def counts_dict(self) -> dict:
        return {name: c.to_dict() for name, c in self.counts.items()}

    def served_lines(self) -> list[str]:
        """Per variant, what it drew and borrowed (`ReplayCounts.line`)."""
        return [f"{name}: {c.line()}" for name, c in self.counts.items()]

    def close(self) -> None:
        pass

    def describe_costs(self) -> dict[str, str]:
        return {role: cost.describe() for role, cost in self.costs.items()}

    def step_prices(self) -> str | None:
        """What priced a roofline step (`RooflineCost.prices`: measured efficiencies and
        their source, or the datasheet); None for a fitted cost, which `replay.step_costs`
        does not touch."""
        cost = self.costs.get("generator")
        return cost.prices() if isinstance(cost, RooflineCost) else None


def host_parts(v: dict) -> tuple[float, float, float]:
    """(host s per generator step, per verifier step, per iteration) of a recorded variant's
    summary (`ReplayBackends.host_parts`).

    The host time is the variant's wall time inside neither model's steps. The problems'
    generator and verifier times say how it divides: with one problem in flight they add
    up to the wall time, but with several each problem counts the phases it shared, so
    their sum can exceed the wall time many times over: then the parts are scaled to the
    host time the run measured."""
    n = v.get("num_problems") or 0
    gen_steps = (v.get("generator") or {}).get("cost") or {}
    ver_steps = (v.get("verifier") or {}).get("cost") or {}
    wall = v.get("wall_s") or 0.0
    gen_time, ver_time = (v.get("generator_s_mean") or 0.0) * n, (v.get("verifier_s_mean") or 0.0) * n
    iterations = (v.get("iterations_mean") or 0.0) * n
    inside_gen = max(0.0, gen_time - gen_steps.get("wall_s", 0.0))
    inside_ver = max(0.0, ver_time - ver_steps.get("wall_s", 0.0))
    between = max(0.0, wall - gen_time - ver_time)
    host = max(0.0, wall - gen_steps.get("wall_s", 0.0) - ver_steps.get("wall_s", 0.0))
    parts = inside_gen + inside_ver + between
    if gen_time + ver_time > wall and parts > 0:  # problems overlapped
        inside_gen, inside_ver, between = (x * host / parts for x in (inside_gen, inside_ver, between))
    return (inside_gen / gen_steps["steps"] if gen_steps.get("steps") else 0.0,
            inside_ver / ver_steps["steps"] if ver_steps.get("steps") else 0.0,
            between / iterations if iterations else 0.0)


def simulated_host(cfg: Config, backends: ReplayBackends, recorded_host: dict | None) -> dict:
    """The replay's host record: the simulated device and models, the cost model, and the
    host the trace was recorded on."""
    return {"simulated": True, "device": asdict(cfg.device),
            "models": {"generator": cfg.generator.model, "verifier": cfg.verifier.model},
            "dtype": {"generator": cfg.generator.dtype, "verifier": cfg.verifier.dtype},
            "cost": backends.cost_kind(), "step_costs": backends.step_prices(),
            "cost_models": backends.describe_costs(),
            "cost_from": ({"run": backends.options.cost_from, "host": backends.pricing.get("host")}
                          if backends.pricing is not None else None),
            "sampler": (recorded_host or {}).get("sampler"), "verifier_prompts": backends.tokenizer_note,
            "overlap": backends.overlap,
            "recorded_on": recorded_host}
