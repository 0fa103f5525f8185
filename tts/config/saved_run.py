"""A recorded run's config with the overrides of a command that runs on it again: `tts
replay` (`replay_config`, and its `replay.*` options, `ReplayOptions`) and `tts rescore`
(the run's config with another verifier). The recorded run's problems and search stay
(`KEPT_GROUPS`): its trace's tree and its candidates are theirs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tts.config.compose import ConfigError, compose
from tts.config.record_for import RecordFor
from tts.config.schema import Config

GROUPS = ("device", "generator", "verifier", "memory")
# Groups a replay keeps from the recorded run: the trace's tree is theirs. `logger` is
# accepted and changes nothing: a replay never logs to W&B.
KEPT_GROUPS = ("dataset", "optim", "search")
# What a generator= / verifier= choice takes from its group: the model and how it runs. The
# recorded run's step limits, path budget and temperature stay: the trace's tree is theirs.
# Its backend too: a fake run's trace may be priced for a real pair.
MODEL_KEYS = {"generator": ("model", "backend", "dtype", "tensor_parallel_size"),
              "verifier": ("model", "backend", "dtype", "adapter", "judge_prompt_file")}
COSTS = ("auto", "fitted", "roofline")
STEP_COSTS = ("measured", "datasheet")
HOSTS = ("recorded", "none")
SPECULATION = ("device", "recorded")


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    """`replay.*` overrides: the step cost model, the per-step launch overhead a roofline
    adds (an assumption, not a datasheet figure), and whether the engine's host time per
    step (Python between model steps, as recorded) is charged."""

    cost: str = "auto"
    # what a roofline step costs: the device profile's measured efficiencies (a profile
    # without them: its own numbers), or the datasheet's peak numbers (tts.metrics.step_cost)
    step_costs: str = "measured"
    launch_ms: float = 2.0
    host: str = "recorded"
    # `spec_batch_cap=-1` resolved for the simulated device (its decode ridge batch), or
    # kept at what the recorded run resolved: the recorded tree, whose tokens are all in the trace
    speculation: str = "device"
    # another run's folder whose fitted step models price the steps (same models, another
    # host or dtype; the models run in its dtype): e.g. an exact float32 trace, whose trees
    # replay token for token, priced at a bf16 host's step costs
    cost_from: str = ""
    # vLLM's asynchronous scheduling on the simulated device: a step costs the larger of its
    # model time and its host time, and each request stopped in a step decodes one more
    # token in the next (tts.replay.backends.ReplayGenerator); false: their sum. null (not
    # given): as the recorded run's generator ran (its host's `overlap`; off before it was recorded)
    overlap: bool | None = None
    # serve every replayed variant this recorded variant's outputs first ("own": its tree),
    # then its own recording's, then another's: each variant's schedule, speculation and
    # memory on one tree, where the recording grew one per variant (bf16, or a float32 CPU
    # whose rows move with the batch); empty: each variant its own recording first
    tree: str = ""

    def named(self) -> str:
        """The options not at their defaults, as a replay's folder name carries them
        (`step_costs-datasheet-host-none`): two replays of one run at other options land in
        two folders. Empty at the defaults."""
        parts = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != field.default:
                shown = Path(value).name if field.name == "cost_from" else str(value).lower()
                parts.append(f"{field.name}-{shown}")
        return "-".join(parts)

    def __post_init__(self) -> None:
        if self.cost not in COSTS:
            raise ConfigError(f"replay.cost: {self.cost!r}; valid choices: {', '.join(COSTS)}")
        if self.step_costs not in STEP_COSTS:
            raise ConfigError(f"replay.step_costs: {self.step_costs!r}; valid choices: {', '.join(STEP_COSTS)}")
        if self.host not in HOSTS:
            raise ConfigError(f"replay.host: {self.host!r}; valid choices: {', '.join(HOSTS)}")
        if self.speculation not in SPECULATION:
            raise ConfigError(f"replay.speculation: {self.speculation!r}; valid choices: {', '.join(SPECULATION)}")
        if self.launch_ms < 0:
            raise ConfigError(f"replay.launch_ms: {self.launch_ms} must be >= 0")
        if self.overlap not in (None, True, False):
            raise ConfigError(f"replay.overlap: {self.overlap!r}; valid choices: true, false")
        if self.cost_from and self.cost == "roofline":
            raise ConfigError("replay.cost_from: prices the steps with that run's fitted step models; "
                              "it does not go with replay.cost=roofline")


def replay_config(saved: dict, overrides: list[str]) -> tuple[DictConfig, ReplayOptions]:
    """The recorded run's config with the overrides: a group choice (`device=h100`,
    `memory=...`) takes that group's config, and `generator=...` / `verifier=...` that
    group's model, dtype (and verifier adapter) only (`MODEL_KEYS`); `replay.KEY=VALUE`
    sets an option; any other `KEY=VALUE` sets that key (e.g.
    `bench.compare=[baseline,PMS,decoupled]` replays other variants over the trace).
    `dtype: auto` is pinned to what the recorded run resolved, or bf16 on a GPU. On a GPU
    the memory settings are `memory=gpu`'s unless `memory=...` is named, or the run was
    recorded for this card (`bench.record_for`): then they are the recorded run's, those
    its decisions were priced with. The replay records for no card itself."""
    from tts.config.schema import register_configs

    register_configs()
    groups, options, dotted = [], {}, []
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"{o!r}: an override is KEY=VALUE")
        key, value = o.split("=", 1)
        if key in GROUPS:
            groups.append(o)
        elif key == "logger":  # a replay never logs, but a wrong choice is still named
            compose("config", [o])
        elif key in KEPT_GROUPS:
            raise ConfigError(f"{o}: a replay keeps the recorded run's {key} (the trace's tree is "
                              f"its); group choices a replay takes: {', '.join(GROUPS)} "
                              f"(and logger, which changes nothing: a replay never logs); "
                              f"one key of {key} goes as {key}.KEY=VALUE")
        elif key.startswith("replay."):
            name = key.removeprefix("replay.")
            if name not in {f.name for f in dataclasses.fields(ReplayOptions)}:
                raise ConfigError(f"{key}: no such replay option; valid: replay.cost, replay.cost_from, "
                                  "replay.step_costs, replay.launch_ms, replay.host, replay.speculation, "
                                  "replay.overlap, replay.tree")
            options[name] = (float(value) if name == "launch_ms" else
                             {"true": True, "false": False}.get(value.lower(), value) if name == "overlap" else value)
        else:
            dotted.append(o)
    cfg = OmegaConf.merge(OmegaConf.structured(Config), saved)
    if groups:
        fresh = compose("config", groups)
        for o in groups:
            key = o.split("=", 1)[0]
            if key in MODEL_KEYS:  # the model named, not its group's search settings (step limits)
                for name in MODEL_KEYS[key]:
                    cfg[key][name] = fresh[key][name]
            else:
                cfg[key] = fresh[key]
    recorded_for = ((saved.get("bench") or {}).get("record_for") or {}).get("device")
    named = any(o.startswith("memory=") for o in groups)
    if cfg.device.kind == "gpu" and not named and recorded_for != cfg.device.name:
        cfg.memory = compose("config", ["memory=gpu"]).memory
    if dotted:
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
        except Exception as err:
            raise ConfigError(f"{dotted}: {err}") from err
    cfg.bench.resume = False
    cfg.bench.record_for = OmegaConf.structured(RecordFor())
    cfg.logger.wandb = False
    return cfg, ReplayOptions(**options)


def pin_dtypes(cfg: DictConfig, recorded_host: dict | None) -> None:
    """`dtype: auto` as the recorded run resolved it (a model unchanged, on the recorded
    device), else the model's own dtype as a GPU runs it (bf16)."""
    recorded = (recorded_host or {}).get("dtype") or {}
    for role in ("generator", "verifier"):
        if cfg[role].dtype == "auto" and cfg[role].backend != "fake":
            same = cfg.device.kind == "cpu" and recorded.get(role) not in (None, "fake")
            cfg[role].dtype = recorded[role] if same else "bfloat16"
