"""The engine's typed options, and the one builder from the config's `OptimConfig`.

Every default here is `OptimConfig`'s own (read off its dataclass, never written twice);
what `OptimConfig` does not hold (the run's concurrency, seed, sampling) is the run's and
comes from the builder's arguments. A schedule reads only these options: the shared ones
(`EngineOptions`), early exit and rejection (`AdaptiveOptions`), and the decoupled
discipline's own (`DecoupledOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from tts.config.enums import DecoupledPolicy, DecoupledSpecScope, LookaheadScope
from tts.config.schema import OptimConfig

_OPTIM = OptimConfig()  # the defaults

# KV usage at which speculation stops (both disciplines): real work keeps the rest
KV_SPEC_LIMIT = 0.95


@dataclass(frozen=True)
class AdaptiveOptions:
    """Early exit and early rejection (`tts.engine.adaptive`); all off by default."""

    early_exit: bool = _OPTIM.early_exit
    exit_top: int = _OPTIM.exit_top
    exit_agree: float = _OPTIM.exit_agree
    exit_patience: int = _OPTIM.exit_patience
    exit_plateau: float = _OPTIM.exit_plateau
    early_reject: bool = _OPTIM.early_reject
    reject_interval: int = _OPTIM.reject_interval
    reject_margin: float = _OPTIM.reject_margin


@dataclass(frozen=True)
class DecoupledOptions:
    """The decoupled discipline's own options (`tts.engine.decoupled`)."""

    fill_policy: DecoupledPolicy = _OPTIM.decoupled_policy
    verifier_batch_size: int = _OPTIM.verifier_batch_size  # PRM items per call; 0 = no cap
    spec_scope: DecoupledSpecScope = _OPTIM.decoupled_spec_scope
    spec_guard: bool = _OPTIM.decoupled_spec_guard


class VerifierShape(NamedTuple):
    """How a verifier asks, as two of the engine's decisions read it: lookahead's `auto`
    scope (none for a verifier that asks once per score) and early rejection (only for one
    that reads a partial step)."""

    request_per_score: bool
    reads_partial_steps: bool


@dataclass(frozen=True)
class EngineOptions:
    concurrency: int = 1
    seed: int = 0
    score_cache: bool = _OPTIM.score_cache
    eos_at_depth_limit: bool = _OPTIM.eos_at_depth_limit
    speculative: bool = _OPTIM.speculative
    lookahead: bool = _OPTIM.lookahead
    lookahead_scope: LookaheadScope | str = _OPTIM.lookahead_scope
    ordering: str = _OPTIM.request_order
    spec_max_tokens: int = _OPTIM.spec_max_tokens
    spec_batch_cap: int = 0  # 0 = the generator's batch cap (the builder resolves optim's -1)
    spec_truncate_ratio: float = _OPTIM.spec_truncate_ratio
    spec_truncate_std: float = _OPTIM.spec_truncate_std
    spec_own_min_tokens: int = _OPTIM.spec_own_min_tokens  # a duplicate samples this many of its own step
    # the start rule of speculation by name (`tts.engine.speculation.registry`); auto: the
    # discipline's own (run-on on the barrier with `speculative`, scoped on the decoupled one)
    spec_rule: str = _OPTIM.spec_rule
    spec_prune: bool = _OPTIM.spec_prune  # stop the speculation of beams selection cannot keep (barrier.py)
    kv_spec_limit: float = KV_SPEC_LIMIT
    temperature: float = 0.8
    top_p: float = 1.0
    # a problem that starts with none in flight starts on empty prefix caches: its result
    # then does not depend on what ran before it (bf16 logits change with what the cache
    # served), so a resumed run or a problem re-run alone repeats it
    fresh_cache_per_problem: bool = False
    # the verifier the engine decides for (`tts.assembly.build.verifier_shape`): a run
    # recorded for a card decides as the card's pair would, whatever verifier scores here;
    # None: the verifier tells its own (`shape_of`)
    verifier_shape: VerifierShape | None = None
    adaptive: AdaptiveOptions = field(default_factory=AdaptiveOptions)
    decoupled: DecoupledOptions = field(default_factory=DecoupledOptions)


def shape_of(opts: EngineOptions, verifier: Any) -> VerifierShape | None:
    """How the engine's decisions take the verifier to ask: `opts.verifier_shape` where
    set, else the run's own verifier's; None without a verifier."""
    if opts.verifier_shape is not None:
        return opts.verifier_shape
    if verifier is None:
        return None
    return VerifierShape(verifier.request_per_score, verifier.reads_partial_steps)


def adaptive_options(optim: OptimConfig) -> AdaptiveOptions:
    """Its fields are `OptimConfig`'s own, by name."""
    return AdaptiveOptions(**{f.name: getattr(optim, f.name) for f in fields(AdaptiveOptions)})


def decoupled_options(optim: OptimConfig) -> DecoupledOptions:
    return DecoupledOptions(fill_policy=optim.decoupled_policy, verifier_batch_size=optim.verifier_batch_size,
                            spec_scope=optim.decoupled_spec_scope, spec_guard=optim.decoupled_spec_guard)


def options_for(optim: OptimConfig, *, concurrency: int = 1, seed: int = 0, spec_batch_cap: int = 0,
                   temperature: float = 0.8, top_p: float = 1.0,
                   fresh_cache_per_problem: bool = False,
                   verifier_shape: VerifierShape | None = None) -> EngineOptions:
    """The options of an engine that runs `optim`; the keywords are the run's (the bench's
    concurrency and seed, sampling, optim's `spec_batch_cap` with -1 resolved, the verifier
    it decides for)."""
    return EngineOptions(
        concurrency=concurrency, seed=seed, score_cache=optim.score_cache,
        eos_at_depth_limit=optim.eos_at_depth_limit, speculative=optim.speculative,
        lookahead=optim.lookahead, lookahead_scope=optim.lookahead_scope,
        ordering="prefix_aware" if optim.prefix_aware else optim.request_order,
        spec_max_tokens=optim.spec_max_tokens, spec_batch_cap=spec_batch_cap,
        spec_truncate_ratio=optim.spec_truncate_ratio, spec_truncate_std=optim.spec_truncate_std,
        spec_own_min_tokens=optim.spec_own_min_tokens, spec_rule=optim.spec_rule,
        spec_prune=optim.spec_prune, temperature=temperature, top_p=top_p,
        fresh_cache_per_problem=fresh_cache_per_problem, verifier_shape=verifier_shape,
        adaptive=adaptive_options(optim), decoupled=decoupled_options(optim))
