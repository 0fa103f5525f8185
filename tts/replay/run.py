"""`tts replay RUN [OVERRIDES]`: a recorded run's trace replayed through the engine's own
scheduling on a simulated clock, for another device or other model sizes.

The replay runs the recorded run's variants (its `bench.compare`, or as overridden) with
the real engine code over the recorded problems, on replay backends (`tts.replay.backends`)
that answer from the trace and move a virtual clock (`tts.clock`) by a step cost model:
the run's own fitted one (`replay.cost=fitted`, the default on the recorded device with
the recorded models) or the roofline of a device profile for the models named
(`replay.cost=roofline`, the default otherwise). Tokens stay the recorded generator's:
the tree is the recorded one; what changes is what each step costs, and therefore every
decision the engine takes from time (the speculation guard, the memory policy).

It writes a results folder like a bench run's whose host is the simulated device: every
figure in it is simulated, and `tts report` says so above every table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tts.clock import VirtualClock, simulated
from tts.config.compose import ConfigError, validate
from tts.config.saved_run import pin_dtypes, replay_config
from tts.config.schema import Config
from tts.kv_budget import kv_of_the_card, kv_of_working_set
from tts.markdown import markdown_table, number
from tts.replay.provenance import ReplayProvenance, write_markdown
from tts.results.ratios import ratio
from tts.results.store import RunStore
from tts.trace.format import read_trace


def pricing_run(cfg: DictConfig, run: str, overrides: list[str]) -> dict:
    """`replay.cost_from`: the pricing run's summary, read once. It must have run the same
    models (its fit prices their steps on its host, in its dtype), and each model runs in
    the dtype it ran it in (its steps' costs are that dtype's, and so must the KV cache's
    bytes per token be), unless the command line names one (`generator.dtype=...`)."""
    store = RunStore(Path(run))
    try:
        summary, saved = store.summary(), store.saved_config()
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"replay.cost_from: {err}") from None
    for role in ("generator", "verifier"):
        theirs = (saved.get(role) or {}).get("model")
        if theirs != cfg[role].model:
            raise ConfigError(f"replay.cost_from: {run} ran {role} {theirs!r}, the replay {cfg[role].model!r}; "
                              "its step costs price other models")
        dtype = ((summary.get("host") or {}).get("dtype") or {}).get(role)
        named = any(o.split("=", 1)[0].lstrip("+") == f"{role}.dtype" for o in overrides)
        if dtype not in (None, "fake") and not named:
            cfg[role].dtype = dtype
    return summary


def check_fits(cfg: Config) -> None:
    """On a GPU, both models' weights and the KV budget must fit the device's memory (the
    replay does not model offloading); ConfigError naming the numbers otherwise."""
    if cfg.device.kind != "gpu":
        return
    from tts.assembly.memory_split import model_shape

    weights = sum(model_shape(m.model, m.dtype).weight_bytes for m in (cfg.generator, cfg.verifier)) / 1e9
    kv = cfg.memory.kv_cache_gib * (1 << 30) / 1e9
    if weights + kv > cfg.device.memory_gb:
        raise ConfigError(f"memory.kv_cache_gib={cfg.memory.kv_cache_gib}: {weights:.1f} GB of weights and "
                          f"{kv:.1f} GB of KV cache do not fit {cfg.device.name}'s {cfg.device.memory_gb:g} GB; "
                          "lower memory.kv_cache_gib")


def keep_speculation_width(cfg: DictConfig, recorded: Config) -> None:
    """Pin `spec_batch_cap` to what the recorded run resolved `-1` to (its device's ridge
    batch), so the replayed variants speculate as wide as the recorded ones did."""
    from tts.assembly.build import spec_batch_cap
    from tts.assembly.variants import variant_optims

    caps = {spec_batch_cap(recorded, optim) for _, optim in variant_optims(recorded)
            if optim.speculative and optim.spec_batch_cap < 0}
    if len(caps) == 1:
        cfg.bench.optim_overrides = [*cfg.bench.optim_overrides, f"spec_batch_cap={caps.pop()}"]


def problems_from_records(records: list[dict]) -> list:
    """The recorded run's problems, in the order first recorded."""
    from eval.problem import Problem

    seen: dict[str, Problem] = {}
    for r in records:
        if r["problem_id"] not in seen:
            seen[r["problem_id"]] = Problem(r["problem_id"], r["problem"], r["gold"], r.get("level"),
                                            r.get("subject"))
    return list(seen.values())


def run_replay(run_dir: Path, overrides: list[str], results_dir: Path | None = None,
               run_name: str | None = None, progress=None) -> Path:
    """Replay the run in `run_dir` (module docstring); returns the replay's results folder."""
    from tts.replay.setup import ReplayBackends, simulated_host
    from tts.bench.loop import run_problems

    run_dir = Path(run_dir)
    store = RunStore(run_dir)
    saved = store.saved_config()
    if not saved:
        raise ConfigError(f"{run_dir}: not a run folder (no config.yaml)")
    trace = read_trace(store.trace)
    recorded = store.summary()
    recorded_cfg: Config = validate(OmegaConf.merge(OmegaConf.structured(Config), saved))
    cfg_node, options = replay_config(saved, overrides)
    pin_dtypes(cfg_node, recorded.get("host"))
    cfg_node = kv_of_working_set(cfg_node)  # the share of the replay's own working set (its models)
    kv_of_the_card(cfg_node, overrides)
    pricing = pricing_run(cfg_node, options.cost_from, overrides) if options.cost_from else None
    if options.speculation == "recorded":
        keep_speculation_width(cfg_node, recorded_cfg)
    problems = problems_from_records(store.records())
    if not problems:
        raise ConfigError(f"{run_dir}: the run recorded no problems")
    cfg_node.bench.results_dir = str(results_dir or run_dir.parent)
    named = "-".join(filter(None, (cfg_node.device.name, _short(cfg_node), options.named())))
    cfg_node.bench.run_name = run_name or f"{run_dir.name}-replay-{named}"
    cfg: Config = validate(cfg_node)
    check_fits(cfg)
    clock = VirtualClock()
    backends = ReplayBackends(cfg, recorded_cfg, trace, recorded, options, clock, pricing)
    watch = ReplayProvenance(trace.provenance, cfg, problems, backends,  # the same card, code and options?
                             trace.header.get("record_for"), options.tree)
    host = {**simulated_host(cfg, backends, recorded.get("host")), "options": dataclasses.asdict(options),
            "provenance": watch.host()}
    with simulated(clock):
        path = run_problems(cfg, cfg_node, problems, backends, host, progress=progress,
                            on_iteration=watch.on_iteration, record_trace=False)
    out = RunStore(path)
    summary = out.summary()
    against, replayed = against_recorded(recorded, summary), watch.summary()
    summary["simulated"] = {**host, "trace": str(store.trace),
                            "trace_truncated": trace.truncated, "served": backends.counts_dict(),
                            "served_lines": backends.served_lines(), "against_recorded": against, **replayed,
                            "against_recorded_md": "\n\n".join(filter(None, [
                                "\n".join(f"- {line}" for line in replayed["provenance_lines"]),
                                format_against(against), "\n".join(f"- {line}" for line in backends.served_lines())]))}
    summary["host"]["provenance"] = watch.host(replayed["divergence"])  # the first line says it
    out.write_summary(summary)
    write_markdown(path, summary)
    return path


def _short(cfg) -> str:
    return "-".join(Path(str(m)).name for m in (cfg.generator.model, cfg.verifier.model))


COMPARED = (("generator_s_mean", "generator time per problem (s)"), ("verifier_s_mean", "verifier time per problem (s)"),
            ("latency_s_mean", "completion latency (s)"), ("precise_goodput", "precise goodput (tok/s)"),
            ("wall_s", "variant wall time (s)"), ("total_gen_tokens", "generated tokens"),
            ("model_busy_share", "model busy share (both models' step time / wall time)"))


def against_recorded(recorded: dict, replayed: dict) -> dict:
    """Per variant in both, each compared metric recorded, replayed and their ratio; and
    the ratio of each variant to the first, recorded and replayed (a validation when the
    replay prices the recorded device with its own fitted model)."""
    rec, rep = recorded.get("variants", {}), replayed.get("variants", {})
    names = [n for n in rep if n in rec]
    out: dict = {"variants": {}, "ratios": {}}
    for name in names:
        out["variants"][name] = {key: _trio(rec[name].get(key), rep[name].get(key)) for key, _ in COMPARED}
    if names:
        first = names[0]
        for name in names[1:]:
            out["ratios"][f"{name}/{first}"] = {
                key: _trio(ratio(rec[name].get(key), rec[first].get(key)), ratio(rep[name].get(key), rep[first].get(key)))
                for key, _ in COMPARED}
    return out


def format_against(against: dict) -> str:
    """The replay against the recorded run, as a Markdown table (each variant's compared
    metrics, then each variant's ratio to the first)."""
    labels = dict(COMPARED)
    rows = [[name, labels[key], *(number(trio[k], "{:.4g}") for k in ("recorded", "replayed", "replayed/recorded"))]
            for group in ("variants", "ratios") for name, metrics in against.get(group, {}).items()
            for key, trio in metrics.items()]
    return markdown_table(["variant", "metric", "recorded", "simulated", "simulated/recorded"], rows) if rows else ""


def _trio(recorded, replayed) -> dict:
    return {"recorded": recorded, "replayed": replayed, "replayed/recorded": ratio(replayed, recorded)}
