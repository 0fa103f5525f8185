"""`tts report`: tables against the runs' summaries, plots, errors, W&B runs, the CLI verb."""

from __future__ import annotations

import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from tts.report import ReportError, write_report
from tts.report.plots import split_sweep, sweep_metrics
from tts.results.ratios import RATIO_METRICS


def _bench(results: Path, name: str, n: int, extra: list[str] | None = None) -> Path:
    from tts.config.compose import compose
    from tts.runner import run_bench

    cfg = compose("config", ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=2",
                             f"search.n={n}", "search.beam_width=2", f"bench.results_dir={results}",
                             f"bench.run_name={name}", *(extra or [])])
    return Path(run_bench(cfg))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    results = tmp_path_factory.mktemp("results")
    return {"n2": _bench(results, "n2", 2), "n4": _bench(results, "n4", 4),
            "cmp": _bench(results, "cmp", 2, ["bench.compare=[baseline,P]"])}


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _md_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The headline-metric table of report.md: its header and {metric label: cells}."""
    block = text.split("## Headline metrics", 1)[1].split("## Key config", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    split = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return split[0][1:], {row[0]: row[1:] for row in split[2:]}


def test_table_values_and_ratios_match_summaries(runs, tmp_path):
    path = write_report([str(runs["n2"]), str(runs["n4"])], None, tmp_path / "rep")
    assert path == tmp_path / "rep" / "report.md"
    base, other = _summary(runs["n2"])["variants"], _summary(runs["n4"])["variants"]
    (base,), (other,) = base.values(), other.values()
    header, table = _md_table(path.read_text())
    assert header == ["n2", "n4", "n4 ÷ n2"]
    rows = {r["metric"]: r for r in json.loads((path.parent / "report.json").read_text())["rows"]}
    checked = intervals = 0
    for key, label, _ in RATIO_METRICS:
        if key not in base:
            continue
        assert rows[label]["n2"] == base[key] and rows[label]["n4"] == other[key]
        for col, value in enumerate((base[key], other[key])):
            if value is None:  # not applicable (a hit rate with nothing made ahead)
                assert table[label][col] == "-"
            else:
                assert float(table[label][col]) == pytest.approx(value, rel=6e-3, abs=1e-12)
        if base[key]:
            assert rows[label]["n4/n2"] == pytest.approx(other[key] / base[key])
            ratio, _, interval = table[label][2].partition(" ")
            assert float(ratio) == pytest.approx(other[key] / base[key], rel=6e-3)
            if "n4/n2_ci" in rows[label]:  # a speed ratio: its paired interval over the 2 problems
                low, high = rows[label]["n4/n2_ci"]
                assert interval.startswith("[") and rows[label]["n_pairs"] == {"n4": 2} and low <= high
                intervals += 1
            else:
                assert interval == ""
            checked += 1
        else:
            assert table[label][2] == "-"
    assert checked >= 5 and intervals == 6  # goodput, latency, generator, verifier, problems/min, tokens
    assert table["(problem, seed) pairs behind the 95% intervals (bootstrap over problems)"] == ["-", "-", "2"]


def test_markdown_embeds_existing_pngs_and_config(runs, tmp_path):
    path = write_report([str(runs["n2"]), str(runs["n4"])], None, tmp_path / "rep")
    text = path.read_text()
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert {"goodput_latency_by_n.png", "accuracy.png", "cache_hit_rates.png"} <= set(pngs)
    for png in pngs:
        assert (path.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = text.split("## Key config", 1)[1]
    assert re.search(r"\| n4 \| beam \| 4 \| 2 \| baseline \|", config)
    assert "embedded first 2" in config and "fake" in config


def test_multi_variant_run_gives_one_column_per_variant(runs, tmp_path):
    path = write_report([str(runs["n2"]), str(runs["cmp"])], "cmp", tmp_path / "rep")
    header, table = _md_table(path.read_text())
    assert header[:3] == ["n2", "cmp/baseline", "cmp/P"]
    assert "n2 ÷ cmp/baseline" in header and "cmp/P ÷ cmp/baseline" in header
    variants = _summary(runs["cmp"])["variants"]
    label = "precise goodput (tok/s)"
    assert float(table[label][2]) == pytest.approx(variants["P"]["precise_goodput"], rel=6e-3)
    assert "| cmp/P | beam | 2 | 2 | flash+P |" in path.read_text()


def test_key_config_shows_compare_overrides_and_memory_split(tmp_path):
    """A compare run's columns are its presets with the run's `optim.*` overrides on top,
    and the memory column says how the KV budget was split."""
    run = _bench(tmp_path / "results", "pm", 2, ["bench.compare=[baseline,PM]", "optim.prefix_aware=false"])
    text = write_report([str(run)], None, tmp_path / "rep").read_text()
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in text.split("## Key config", 1)[1].splitlines() if ln.startswith("| pm/")}
    assert rows["pm/PM"][4] == "flash+M"  # P switched off by the override
    assert rows["pm/PM"][-1] == "1.0 GiB, roofline"
    assert rows["pm/baseline"][-1] == "1.0 GiB, static 0.5"


def test_missing_folder_names_it(runs, tmp_path):
    missing = tmp_path / "no-such-run"
    with pytest.raises(ReportError, match=re.escape(str(missing))):
        write_report([str(runs["n2"]), str(missing)], None, tmp_path / "rep")


def test_folder_without_summary_names_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=r"empty: no summary\.json"):
        write_report([str(tmp_path / "empty")], None, tmp_path / "rep")


@pytest.mark.parametrize("filename, text, what", [
    ("summary.json", '{"variants": {"baseline": {"precise_goodput": 1.0', "corrupt summary"),
    ("summary.json", '{"baseline": "x"}', "corrupt summary"),
    ("records.jsonl", '{"variant": "baseline"}\nnot json\n{"variant": "baseline"}\n', "corrupt records.jsonl"),
])
def test_corrupt_files_name_the_folder(runs, tmp_path, filename, text, what):
    bad = tmp_path / "bad-run"
    shutil.copytree(runs["n2"], bad)
    (bad / filename).write_text(text)
    with pytest.raises(ReportError, match=re.escape(str(bad)) + ".*" + what):
        write_report([str(runs["n4"]), str(bad)], None, tmp_path / "rep")


def test_unknown_baseline_lists_names(runs, tmp_path):
    with pytest.raises(ReportError) as err:
        write_report([str(runs["n2"]), str(runs["cmp"])], "nope", tmp_path / "rep")
    for name in ("n2", "cmp/baseline", "cmp/P", "cmp"):
        assert name in str(err.value)


def test_same_folder_names_are_told_apart(runs, tmp_path):
    other = tmp_path / "elsewhere" / "n2"
    shutil.copytree(runs["n2"], other)
    path = write_report([str(runs["n2"]), str(other)], "elsewhere/n2", tmp_path / "rep")
    header, _ = _md_table(path.read_text())
    assert header[1] == "elsewhere/n2" and header[0].endswith("/n2")


def test_memory_profile_is_plotted(runs, tmp_path):
    prof = tmp_path / "profile-run"
    prof.mkdir()
    sweep = [{"generator_fraction": f, "precise_goodput": 100 * f, "kv_blocks_generator": int(64 * f)}
             for f in (0.1, 0.5, 0.9)]
    (prof / "profile.json").write_text(json.dumps({"breakdown": {}, "sweep": sweep}))
    path = write_report([str(runs["n2"]), str(prof)], None, tmp_path / "rep")
    assert "![Memory split sweep](memory_split.png)" in path.read_text()
    assert (path.parent / "memory_split.png").stat().st_size > 0
    sweeps = [split_sweep(json.loads((prof / "profile.json").read_text()))]
    assert sweep_metrics(sweeps) == ["precise_goodput", "kv_blocks_generator"]
    only = write_report([str(prof)], None, tmp_path / "rep2")
    assert (only.parent / "memory_split.png").exists()


def test_split_sweep_shapes():
    assert split_sweep({"sweep": {"0.5": {"tok_s": 2.0}, "0.1": {"tok_s": 1.0}}}) == (
        "split", [{"split": 0.1, "tok_s": 1.0}, {"split": 0.5, "tok_s": 2.0}])
    assert split_sweep({"breakdown": {"generator": 1}}) is None


def test_wandb_offline_says_it_needs_login(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ReportError, match=r"wandb:ent/proj/abc.*(network|login)"):
        write_report(["wandb:ent/proj/abc"], None, tmp_path / "rep")
    with pytest.raises(ReportError, match="entity/project/run_id"):
        write_report(["wandb:just-a-run"], None, tmp_path / "rep")


def _fake_wandb(summary: dict, config: dict, fail: Exception | None = None) -> types.ModuleType:
    class Run:
        name = "remote-run"

        def __init__(self) -> None:
            self.summary_metrics, self.config = summary, config

    class Api:
        def __init__(self, timeout: int | None = None) -> None:
            if fail:
                raise fail

        def run(self, path: str) -> Run:
            assert path == "ent/proj/abc"
            return Run()

    return types.SimpleNamespace(Api=Api)


def test_wandb_run_summary_is_unflattened(runs, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    summary = {"variants/baseline/precise_goodput": 50.0, "variants/baseline/latency_s_mean": 2.0,
               "variants/baseline/generator/steps": 3, "baseline": "baseline"}
    config = {"search": {"n": 8, "algorithm": "beam"}, "optim": {"engine": "baseline"}}
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(summary, config))
    path = write_report(["wandb:ent/proj/abc", str(runs["n2"])], None, tmp_path / "rep")
    header, table = _md_table(path.read_text())
    assert header[:2] == ["remote-run", "n2"]
    goodput = _summary(runs["n2"])["variants"]["baseline"]["precise_goodput"]
    assert table["precise goodput (tok/s)"][0] == "50"
    assert float(table["precise goodput (tok/s)"][2]) == pytest.approx(goodput / 50.0, rel=6e-3)


def test_wandb_failure_says_it_needs_login(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb({}, {}, RuntimeError("No API key configured")))
    with pytest.raises(ReportError, match=r"wandb:ent/proj/abc.*No API key.*wandb login"):
        write_report(["wandb:ent/proj/abc"], None, tmp_path / "rep")


def test_cli_report(runs, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "1000"})
    result = runner.invoke(app, ["report", str(runs["n2"]), str(runs["n4"])])
    assert result.exit_code == 0, result.output
    written = re.search(r"report written to\s*(\S+report\.md)", result.output.replace("\n", ""))
    assert written and (tmp_path / written.group(1)).exists()
    assert Path(written.group(1)).parent.name.startswith("report-")
    missing = runner.invoke(app, ["report", str(runs["n2"]), str(tmp_path / "missing")])
    assert missing.exit_code == 2


def test_accuracy_bars_carry_their_intervals(tmp_path, monkeypatch):
    """The report's accuracy bars carry each accuracy's 95% interval as an error bar, as its
    table does; a metric without an interval gets none."""
    from tts.report import plots
    from tts.report.tables import Column

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, **k: drawn.append(fig) or path)
    metrics = {"acc_majority": 0.5, "acc_majority_ci": [0.25, 0.75], "pass@n": 0.75}
    plots.plot_accuracy(tmp_path / "a.png", [Column("run/baseline", None, "baseline", metrics)])
    [fig] = drawn
    bars = {c.get_label(): c for c in fig.axes[0].containers if hasattr(c, "errorbar")}
    assert bars["majority"].errorbar is not None and bars["pass@N"].errorbar is None
    segment = bars["majority"].errorbar.lines[2][0].get_segments()[0]
    assert [round(y, 6) for _, y in segment] == [0.25, 0.75]
