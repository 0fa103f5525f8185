"""Where a variant's host time goes: the wall time outside every model step, split into
what the engine itself does and what it waits on.

On a CPU a generator step takes tens to hundreds of milliseconds and the host's share is
small; on a GPU a decode step of the paper's 1.5B at batch 256 takes 4 to 6.5 ms, so host
work that is invisible here would make a GPU run host-bound. The split, in seconds over
the variant's wall time and per generator step:

- `host_s`: the wall time less every generator and verifier step (`CostSums.wall_s`);
- `host_backend_calls_s`: in the generator backend's request calls between steps (vLLM's
  `add_request` and `abort_request`: its input processing; `StepStats.calls_s`);
- `host_verifier_s`: inside verifier calls but outside their steps (the PRM's prompts,
  their tokens, the backend's requests, reading the scores back);
- `host_select_s`: selection, timed once per iteration (`SelectionTimed`);
- `host_record_s`: recording each finished problem (grading its candidates, writing its
  record, the step logs and the trace, and the pass's one full garbage collection there,
  `tts.bench.record.quiet_heap`), while no model step runs (`metrics.record_s`);
- `host_engine_s`: the rest, the engine's own work: scheduling, the step rule on every
  token, bookkeeping, metrics, the trace's events.

`engine_per_gen_step_ms` is the engine's own work per generator step, the figure that must
stay small beside a GPU's step; `engine_per_request_us`, the same per running request and
step (a step at n=512 runs a few hundred: the cost that grows with n);
`select_ms_mean` and `select_ms_max`, a selection's.
`model_busy_share` is both models' step time over the wall time: in a replay, the simulated
device's busy share (with `replay.overlap`, host work hides behind the steps and no longer
adds to the wall); in a real run with overlap, a step's time is what tts waited in it, so
the share is a lower bound on the device's.
"""

from __future__ import annotations

from tts.metrics.cost_model import COST, CostSums

# (summary key, label, higher is better): the ratio table's rows (`tts.results.ratios`)
HOST_ROWS = [
    ("model_busy_share", "model busy share: both models' step time / wall time", True),
    ("host_share", "host time outside any model step / wall time", False),
    ("host_per_gen_step_ms", "host time per generator step (ms), of which:", False),
    ("engine_per_gen_step_ms", "- the engine's own: scheduling, the step rule, bookkeeping, trace (ms)", False),
    ("backend_calls_per_gen_step_ms", "- the generator backend's add and abort calls (vLLM's input processing) (ms)",
     False),
    ("verifier_host_per_gen_step_ms", "- verifier calls outside their steps: prompts, tokenizer, scores (ms)", False),
    ("select_per_gen_step_ms", "- selection (ms)", False),
    ("record_per_gen_step_ms", "- recording each problem: grading, records, step logs, trace, a full gc (ms)", False),
    ("engine_per_request_us", "the engine's own per running request and generator step (us)", False),
    ("host_per_request_us", "host time per running request and generator step (us)", False),
    ("select_ms_mean", "selection, per problem iteration (ms)", False),
    ("select_ms_max", "selection, the longest (ms)", False),
]


def add_host_time(summary: dict, records: list[dict]) -> None:
    """The host-time split (module docstring) into `summary`, from its step logs (`generator`,
    `verifier`: their `COST` sums and `model_s`), its wall time and its records' selection
    times. Nothing without generator steps or a wall time."""
    logs = {m: summary.get(m) or {} for m in ("generator", "verifier")}
    gen, ver = (CostSums.from_dict(logs[m].get(COST, {})) for m in ("generator", "verifier"))
    wall = summary.get("wall_s") or sum(r["metrics"]["latency_s"] for r in records)
    if not gen.steps or not wall:
        return
    metrics = [r["metrics"] for r in records]
    select = sum(m.get("select_s", 0.0) for m in metrics)
    verifier = max(0.0, logs["verifier"].get("model_s", 0.0) - ver.wall_s)
    host = wall - gen.wall_s - ver.wall_s
    parts = {"host_backend_calls_s": gen.calls_s, "host_verifier_s": verifier, "host_select_s": select,
             "host_record_s": sum(m.get("record_s", 0.0) for m in metrics)}
    summary.update(parts, host_s=host, host_share=host / wall,
                   host_engine_s=host - sum(parts.values()), model_busy_share=(gen.wall_s + ver.wall_s) / wall)
    per_step = {"host_per_gen_step_ms": "host_s", "engine_per_gen_step_ms": "host_engine_s",
                "backend_calls_per_gen_step_ms": "host_backend_calls_s",
                "verifier_host_per_gen_step_ms": "host_verifier_s", "select_per_gen_step_ms": "host_select_s",
                "record_per_gen_step_ms": "host_record_s"}
    summary.update({key: 1000.0 * summary[part] / gen.steps for key, part in per_step.items()})
    # per running request: the step's requests, summed over its steps (`StepLog.running_mean`)
    if requests := logs["generator"].get("running_mean", 0.0) * gen.steps:
        summary["engine_per_request_us"] = 1e6 * summary["host_engine_s"] / requests
        summary["host_per_request_us"] = 1e6 * host / requests
    iterations = sum(m.get("iterations", 0) for m in metrics)
    if iterations and any("select_s" in m for m in metrics):
        summary["select_ms_mean"] = 1000.0 * select / iterations
        summary["select_ms_max"] = 1000.0 * max(m.get("select_max_s", 0.0) for m in metrics)
