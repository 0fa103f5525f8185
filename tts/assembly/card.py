"""A run recorded for a card (`bench.record_for`): the config its engine's decisions are
priced on, and its engines sized to hold what the card's would.

The run computes every token and score on its own models, on this host, and decides as
the card would with the pair a replay there simulates:
- the speculation width (`spec_batch_cap=-1`: the card's decode ridge batch for the pair's
  generator, `tts.assembly.build.engine_options`);
- the memory split M, the batch caps and their re-plans, on the card's roofline for the
  pair's shapes, within the card's KV budget (`tts.kv_budget.kv_for_the_card`);
- the KV each engine holds, counted in tokens (`in_run_tokens`): the run's engines hold as
  many tokens of their own models as the pair's engines would on the card, so requests
  wait, are preempted and evicted as they would be there;
- the step prices the decoupled schedule's speculation guard weighs (`CardStepPrice`):
  each generator step priced on the card's roofline as a replay prices it, beside the
  host's own wall time, which every measurement keeps;
- how the pair's verifier asks (`tts.assembly.build.verifier_shape`): lookahead's `auto`
  scope and early rejection decide as they would with the card's PRM (a whole-path head:
  lookahead on, no partial steps), while this host's verifier (a chat judge, say) computes
  every score.

`card_config` is the run's config as `tts replay RUN device=... generator=... verifier=...`
makes it (`tts.config.saved_run.replay_config`), so the replay on that card decides from
the config the run decided from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from tts.backends.base import GenDelta, Generator, StepStats
from tts.backends.factory import EngineSpec
from tts.config.compose import validate
from tts.config.saved_run import ReplayOptions, pin_dtypes, replay_config
from tts.config.schema import Config
from tts.metrics.step_cost import StepCost


def card_node(cfg_node: DictConfig) -> DictConfig:
    """The run's config with the card and pair of its `bench.record_for` in place of its
    device and models (their backends, dtypes and adapters; the step limits stay the run's),
    as a replay on that card composes it, `dtype: auto` as a GPU runs it (bf16)."""
    saved = OmegaConf.to_container(cfg_node, resolve=True, enum_to_str=True)
    record_for = cfg_node.bench.record_for
    node, _ = replay_config(saved, [f"{group}={record_for[group]}" for group in ("device", "generator", "verifier")
                                    if record_for[group] is not None])
    pin_dtypes(node, None)
    return node


def card_config(cfg: Config) -> Config:
    """The config the run's decisions are priced on (`card_node`): `cfg` itself when
    `bench.record_for` names no card. Its `memory.kv_cache_gib` is the run's, which
    `kv_for_the_card` made the card's."""
    if cfg.bench.record_for.device is None:
        return cfg
    return _card(json.dumps(OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)))


@functools.lru_cache(maxsize=16)
def _card(saved: str) -> Config:
    return validate(card_node(OmegaConf.create(json.loads(saved))))


def in_run_tokens(cfg: Config, card: Config, role: str, spec: EngineSpec) -> EngineSpec:
    """`spec` (an engine's KV on the card, in bytes of the pair's model) as the same number
    of whole blocks of the run's own model for `role` ("generator" or "verifier"): the
    tokens the card's engine holds, held here."""
    from tts.assembly.memory_split import kv_bytes_per_token

    if card is cfg:
        return spec
    block = cfg.memory.block_size
    blocks = spec.kv_bytes // (block * kv_bytes_per_token(getattr(card, role)))
    return EngineSpec(blocks * block * kv_bytes_per_token(getattr(cfg, role)), spec.max_num_seqs)


class CardStepPrice:
    """A generator step's seconds on the card (`StepStats.card_s`, set by `Generator.step`):
    each request's context followed through its deltas, the step priced as a replay on that
    card prices it (its roofline, at the replay's default step prices and launch,
    `ReplayOptions`): decoding sequences at their contexts, prompts prefilled less what the
    prefix cache served."""

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self._context: dict[str, int] = {}  # request id -> its tokens so far
        self._remove = None

    @classmethod
    def of(cls, card: Config) -> CardStepPrice:
        """The price of the card's generator steps (`card_config`)."""
        from tts.assembly.memory_split import device_profile, model_shape
        from tts.metrics.step_cost import RooflineCost

        options = ReplayOptions()
        shape = model_shape(card.generator.model, card.generator.dtype)
        return cls(RooflineCost(shape, device_profile(card), options.launch_ms / 1e3,
                                options.step_costs == "measured"))

    def attach(self, generator: Generator) -> None:
        """Price `generator`'s steps from now on, in place of a price attached before."""
        if isinstance(generator.step_price, CardStepPrice) and generator.step_price._remove is not None:
            generator.step_price._remove()
        generator.step_price = self
        self._remove = generator.add_request_observer(lambda request: None, self.forget)

    def forget(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            self._context.pop(rid, None)

    def __call__(self, deltas: list[GenDelta], stats: StepStats) -> float:
        decode, prefill = [], []
        for d in deltas:
            context = self._context.pop(d.request_id, None)
            if context is None:  # its first tokens: its prompt prefilled, less what the cache held
                cached = d.num_cached_tokens or 0
                context = d.num_prompt_tokens or 0
                prefill.append((context - cached, cached))
            else:
                decode.append(context)
            if not d.finished:
                self._context[d.request_id] = context + len(d.new_token_ids)
        return self.cost.step_s(decode, prefill)
