"""`tts report`'s scaling section: a sweep over search.n (`--config-name=paper_sweep`),
measured and replayed, as one table and `plots/ratio_by_n.png`, from summary.json folders
made here."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tts.report import write_report
from tts.report.scaling import PAPER_LABEL, plot_ratio_by_n

VARIANTS = ("paper_baseline", "PMS")
MEASURED = {"cpu_model": "Test CPU 9000", "cores": 2, "native_bf16": False, "amx": False, "gpu": None,
            "dtype": {"generator": "float32", "verifier": "float32"}}
SIMULATED = {"simulated": True, "device": {"name": "rtx4090", "kind": "gpu"},
             "models": {"generator": "Qwen/Qwen2.5-Math-1.5B-Instruct", "verifier": "Skywork/Skywork-o1-PRM-1.5B"},
             "dtype": {"generator": "bfloat16", "verifier": "bfloat16"}, "cost": "roofline",
             "options": {"step_costs": "datasheet"}}


def _metrics(n: int, k: int) -> dict:
    """The second variant's (k=1) numbers differ from the first's (k=0) and with n."""
    return {"precise_goodput": 10.0 * n * (1 + k), "latency_s_mean": 5.0 + n / (1 + k),
            "problems_per_min": 12.0 / n * (1 + 0.5 * k), "straggler_gap": 1.5 + k,
            "gen_batch_util_mean": 0.4 + 0.1 * k, "ver_batch_util_mean": 0.3, "generator_s_mean": 4.0 + n,
            "verifier_s_mean": 1.0 + k, "gen_evictions": n * 3, "gen_thrash_blocks": n + k, "gen_preemptions": k,
            "ver_evictions": 2 * n, "ver_thrash_blocks": 0, "latency_bound_s_mean": 2.0 + n / 4,
            "bound_share": 0.25 * (1 + k)}


def _ratios(n: int) -> list[dict]:
    """A ratio table as `tts.results.ratios.ratio_table` writes it (PMS against the first)."""
    col = "PMS/paper_baseline"
    rows = [{"metric": "pairs", "higher_is_better": None, col: 4}]
    for key in ("precise_goodput", "latency_s_mean", "problems_per_min"):
        ratio = _metrics(n, 1)[key] / _metrics(n, 0)[key]
        rows.append({"metric": key, "key": key, col: ratio, f"{col}_ci": [0.9 * ratio, 1.1 * ratio],
                     "n_pairs": {"PMS": 4}, "n_problems": {"PMS": 4}})
    return rows


def _run(folder: Path, n: int, host: dict, ratios: bool = True, fraction: float | None = None) -> Path:
    folder.mkdir(parents=True)
    summary = {"host": host, "variants": {v: _metrics(n, k) for k, v in enumerate(VARIANTS)}, "baseline": VARIANTS[0]}
    if ratios:
        summary["ratios"] = _ratios(n)
    (folder / "summary.json").write_text(json.dumps(summary))
    config = {"search": {"n": n, "beam_width": 4}, "bench": {"compare": list(VARIANTS)},
              "memory": {"working_set_fraction": fraction}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def _sweep(root: Path, host: dict, ns=(8, 32)) -> Path:
    for i, n in enumerate(ns):
        _run(root / f"{i}_search.n={n}", n, host)
    return root


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    block = text.split("## Scaling with n", 1)[1].split("\n## ", 1)[0]
    lines = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in block.splitlines() if ln.startswith("|")]
    return lines[0], lines[2:]


def test_scaling_table_holds_the_summaries_and_labels_simulated_rows(tmp_path):
    measured = _sweep(tmp_path / "sweep", MEASURED)
    simulated = _sweep(tmp_path / "replays", SIMULATED)
    report = write_report([str(measured), str(simulated)], out=tmp_path / "report")
    text = report.read_text()
    head, lines = _table(text)
    assert head[:4] == ["n", "source", "variant", "goodput / baseline [95%]"] and "straggler gap" in head
    assert len(lines) == 2 * 2 * 2  # n x source x variant
    assert [line[0] for line in lines] == ["8"] * 4 + ["32"] * 4
    sim = [line for line in lines if line[1].startswith("simulated")]
    assert len(sim) == 4 and all(line[1] == "simulated on rtx4090 Qwen2.5-Math-1.5B-Instruct+Skywork-o1-PRM-1.5B "
                                         "(datasheet prices)" for line in sim)
    assert {line[1] for line in lines if line not in sim} == {"measured on Test CPU 9000"}
    row = next(line for line in lines if line[0] == "32" and line[2] == "PMS" and line in sim)
    assert row[3] == "2.00x [1.8, 2.2]" and row[head.index("gen evicted")] == "96"
    assert PAPER_LABEL in text and (tmp_path / "report" / "plots" / "ratio_by_n.png").stat().st_size > 0

    data = json.loads((tmp_path / "report" / "report.json").read_text())["scaling"]
    assert data["plot"] == "plots/ratio_by_n.png" and len(data["rows"]) == 8
    for r in data["rows"]:
        base, mine = _metrics(r["n"], 0), _metrics(r["n"], VARIANTS.index(r["variant"]))
        assert r["simulated"] == r["source"].startswith("simulated")
        assert all(r[k] == mine[k] for k in ("straggler_gap", "gen_batch_util_mean", "generator_s_mean",
                                               "verifier_s_mean", "gen_thrash_blocks", "bound_share"))
        if r["variant"] == "PMS":
            assert r["precise_goodput"] == mine["precise_goodput"] / base["precise_goodput"]
            assert r["latency_s_mean_ci"] == next(x for x in _ratios(r["n"]) if x.get("key") == "latency_s_mean"
                                                  )["PMS/paper_baseline_ci"]
            assert r["pairs"] == 4
        else:
            assert "precise_goodput" not in r
    assert {r["price"] for r in data["rows"] if r["simulated"]} == {"datasheet"}


def test_runs_that_do_not_differ_by_n_have_no_scaling_section(tmp_path):
    _run(tmp_path / "a", 8, MEASURED)
    _run(tmp_path / "b", 8, SIMULATED)
    report = write_report([str(tmp_path / "a"), str(tmp_path / "b")], out=tmp_path / "report")
    assert "## Scaling with n" not in report.read_text()
    assert "scaling" not in json.loads((tmp_path / "report" / "report.json").read_text())
    assert not (tmp_path / "report" / "plots" / "ratio_by_n.png").exists()


def test_pressure_cells_are_left_to_the_pressure_section(tmp_path):
    _run(tmp_path / "p" / "a", 8, MEASURED, fraction=0.25)
    _run(tmp_path / "p" / "b", 32, MEASURED, fraction=0.25)
    report = write_report([str(tmp_path / "p")], out=tmp_path / "report")
    assert "## Scaling with n" not in report.read_text() and "## Memory pressure" in report.read_text()


def test_ratios_come_from_the_records_without_a_ratio_table(tmp_path):
    """A run whose summary has no ratio table: the point ratio from its variants, the
    interval from its records (resampled by problem)."""
    for n in (8, 32):
        folder = _run(tmp_path / "s" / f"n{n}", n, MEASURED, ratios=False)
        records = [{"variant": v, "problem_id": f"p{i}", "seed": 0,
                    "metrics": {"beam_tokens": [100 * (1 + k)], "beam_completion_s": [1.0 + i], "latency_s": 2.0 + i,
                                "gen_tokens": 100, "generator_s": 1.0, "verifier_s": 0.5}}
                   for k, v in enumerate(VARIANTS) for i in range(4)]
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report([str(tmp_path / "s")], out=tmp_path / "report")
    rows = json.loads((tmp_path / "report" / "report.json").read_text())["scaling"]["rows"]
    pms = [r for r in rows if r["variant"] == "PMS"]
    assert len(pms) == 2 and all(r["precise_goodput"] == 2.0 and r["pairs"] == 4 for r in pms)
    assert all(r["precise_goodput_ci"] is not None for r in pms)


def test_plot_without_a_ratio_is_not_drawn(tmp_path):
    assert plot_ratio_by_n(tmp_path / "plots" / "x.png", [{"variant": "a", "precise_goodput": None}]) is None
