"""The results folder: records as problems finish, resume, a killed run, re-grading."""

import json
import re

import pytest

from tts.config.compose import compose
from tts.results.store import RECORDS, RunStore
from tts.runner import run_bench

FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
        "search.beam_width=2", "search.max_iterations=4"]


def bench(tmp_path, *extra, name="run", progress=None):
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", f"bench.run_name={name}", *extra])
    return run_bench(cfg, progress=progress)


def test_run_folder_has_config_records_summary_plots(tmp_path):
    path = bench(tmp_path)
    assert (path / "config.yaml").read_text().startswith("generator:")
    records = RunStore(path).records()
    assert [r["problem_id"] for r in records] == ["embedded-1-0", "embedded-2-1", "embedded-3-2"]
    r = records[0]
    assert set(r) >= {"variant", "problem_id", "gold", "candidates", "answers", "verdicts", "correct",
                      "pass@n", "curves", "metrics"}
    assert len(r["candidates"]) == 4 and r["variant"] == "baseline"
    for c in (c for r in records for c in r["candidates"]):  # each step's text, as the verifier scored it
        ends = c["step_ends"]
        assert len(ends) == c["num_steps"] == len(c["step_scores"]) and ends[-1] == len(c["text"])
        assert all(c["text"][a:b] for a, b in zip([0, *ends], ends))
    summary = json.loads((path / "summary.json").read_text())
    base = summary["variants"]["baseline"]
    assert base["num_problems"] == 3 and base["precise_goodput"] > 0
    assert "generator" in base and sum(base["generator"]["batch_util_hist"]) > 0
    assert (path / "plots" / "goodput_by_variant.png").exists()


def test_generator_phase_rate_and_raw_vllm_without_vllm(tmp_path):
    """Each variant's generator phase rate is its decoded tokens over its generator time,
    that time counted once per phase (not per problem in flight); raw vLLM cannot be timed
    on the fake backend, which the summary says instead of a ratio."""
    path = bench(tmp_path, "bench.raw_generator=true", "bench.concurrency=2")
    summary = json.loads((path / "summary.json").read_text())
    base = summary["variants"]["baseline"]
    phase = base["generator"]["model_s"]
    records = RunStore(path).records()
    assert 0 < phase < sum(r["metrics"]["generator_s"] for r in records)  # two problems shared phases
    assert base["gen_phase_tok_s"] == pytest.approx(base["total_gen_tokens"] / phase)
    assert summary["raw_generator"] == {"skipped": "generator.backend=fake: raw vLLM needs a vLLM generator"}
    assert "gen_phase_vs_raw" not in base


def test_goodput_against_one_sequences_decode_rate(tmp_path):
    """With raw vLLM's rates in the run folder, every variant's generator phase is reported
    against the rate at its sequences in flight and its precise goodput against one
    sequence's decode rate, about the best a path's tokens can come at; a measurement without
    the one-sequence rate (written before it was timed) gives no goodput row."""
    from tts.results.summary import write_summary

    path = bench(tmp_path)
    store = RunStore(path)
    store.write_raw_generator({"batch": 4, "tok_s": 80.0, "single_tok_s": 20.0})
    summary, _ = write_summary(store, ["baseline"], store.step_logs(), None)
    base = summary["variants"]["baseline"]
    assert base["gen_phase_vs_raw"] == pytest.approx(base["gen_phase_tok_s"] / 80.0)
    assert base["goodput_vs_ceiling"] == pytest.approx(base["precise_goodput"] / 20.0)
    store.write_raw_generator({"batch": 4, "tok_s": 80.0})
    summary, _ = write_summary(store, ["baseline"], store.step_logs(), None)
    assert "goodput_vs_ceiling" not in summary["variants"]["baseline"]


def test_existing_folder_needs_resume(tmp_path):
    bench(tmp_path)
    with pytest.raises(FileExistsError, match="--resume"):
        bench(tmp_path)


def test_resume_needs_the_run_name(tmp_path):
    """--resume without bench.run_name would start a fresh timestamped folder and skip
    nothing; it is an error that lists the runs there are."""
    with pytest.raises(ValueError, match="bench.run_name=NAME.*holds no run"):
        RunStore.create(tmp_path, None, True, "x")
    bench(tmp_path)
    with pytest.raises(ValueError, match="bench.run_name=NAME; runs in .*: run"):
        RunStore.create(tmp_path, None, True, "x")


def test_resume_with_other_settings_is_refused(tmp_path):
    """Records made with other settings must not be mixed in: the error names each change.
    Settings only one side has (another tts version) and logger.* are not compared."""
    from tts.config.compose import ConfigError

    path = bench(tmp_path)
    with pytest.raises(ConfigError, match=r"other settings \(search.n: 4 -> 2\)"):
        bench(tmp_path, "bench.resume=true", "search.n=2")
    text = (path / "config.yaml").read_text()
    (path / "config.yaml").write_text(text + "retired:\n  setting: 1\n")
    bench(tmp_path, "bench.resume=true", "logger.project=elsewhere")  # nothing to do, no error
    # the order the variants take turns in and the warm-up change no record
    bench(tmp_path, "bench.resume=true", "bench.order=sequential", "bench.warmup=0")


def test_resume_may_add_variants_to_a_comparison(tmp_path):
    """Records are per problem and variant: a resume with more compared variants runs only
    the new one, and the summary compares all; a variant's own settings still count."""
    from tts.config.compose import ConfigError

    path = bench(tmp_path, "bench.compare=[baseline]")
    first = RunStore(path).records()
    bench(tmp_path, "bench.resume=true", "bench.compare=[baseline,P]")
    records = RunStore(path).records()
    assert records[:3] == first  # the baseline's records, not re-run
    assert [r["variant"] for r in records[3:]] == ["P"] * 3
    assert set(json.loads((path / "summary.json").read_text())["variants"]) == {"baseline", "P"}
    with pytest.raises(ConfigError, match=r"other settings \(bench.optim_overrides"):
        bench(tmp_path, "bench.resume=true", "bench.compare=[baseline,P]", "optim.request_order=random")


def test_append_after_a_kill_before_the_newline(tmp_path):
    """A kill between a record and its newline leaves a whole record without one; the
    next record still starts on a line of its own."""
    store = RunStore.create(tmp_path, "r", False, "x")
    store.append({"variant": "v", "problem_id": "a"})
    records = store.path / RECORDS
    records.write_text(records.read_text().rstrip("\n"))
    store.append({"variant": "v", "problem_id": "b"})
    assert [r["problem_id"] for r in store.records()] == ["a", "b"]


def test_killed_run_keeps_records_and_resumes(tmp_path):
    path = bench(tmp_path)
    lines = (path / RECORDS).read_text().splitlines(keepends=True)
    # a kill after the first record, in the middle of writing the second
    (path / RECORDS).write_text(lines[0] + lines[1][:40])
    assert [r["problem_id"] for r in RunStore(path).records()] == ["embedded-1-0"]
    path2 = bench(tmp_path, "bench.resume=true")
    assert path2 == path
    ids = [r["problem_id"] for r in RunStore(path).records()]
    assert ids == ["embedded-1-0", "embedded-2-1", "embedded-3-2"]
    assert json.loads((path / "summary.json").read_text())["variants"]["baseline"]["num_problems"] == 3
    walls = [r["variant_wall_s"] for r in RunStore(path).records()]
    assert walls == sorted(walls)  # the resumed part continues the first part's clock
    whole = bench(tmp_path, name="uninterrupted")  # the same run, never killed
    assert [untimed(r) for r in RunStore(path).records()] == [untimed(r) for r in RunStore(whole).records()]


def test_step_statistics_survive_a_kill_and_add_up(tmp_path):
    """A run killed after one problem (no summary written) and resumed reports the
    generator's and verifier's step statistics of both parts: the same counts as the
    run never killed."""
    first = [o for o in FAKE if not o.startswith("dataset.first_k")]
    cfg = compose("config", first + ["dataset.first_k=1", f"bench.results_dir={tmp_path}", "bench.run_name=run"])
    path = run_bench(cfg)
    (path / "summary.json").unlink()
    part = json.loads((path / "step_logs.json").read_text())["baseline"]["generator"]["steps"]
    bench(tmp_path, "bench.resume=true")
    whole = bench(tmp_path, name="uninterrupted")
    got, want = (json.loads((p / "summary.json").read_text())["variants"]["baseline"] for p in (path, whole))
    for model in ("generator", "verifier"):
        assert got[model]["steps"] == want[model]["steps"], model
        assert got[model]["batch_util_hist"] == want[model]["batch_util_hist"], model
        assert got[model]["running_mean"] == pytest.approx(want[model]["running_mean"]), model
    assert 0 < part < got["generator"]["steps"]


def untimed(record):
    """A record without its wall-clock values (seconds and what is derived from them) and
    its prefix-cache counters: a resumed run starts with a cold cache, the search does not
    depend on it."""
    timed = ("latency_s", "generator_s", "verifier_s", "beam_completion_s", "precise_goodput", "select_s", "record_s",
             "select_max_s", "gen_cached_tokens", "gen_cache_hit_rate", "ver_cached_tokens", "ver_cache_hit_rate")
    out = json.loads(json.dumps(record))
    out.pop("variant_wall_s")
    for key in timed:
        out["metrics"].pop(key)
    for cand in out["candidates"]:
        cand.pop("completed_at")
    return out


def test_corrupt_record_in_the_middle_names_the_line(tmp_path):
    path = bench(tmp_path)
    lines = (path / RECORDS).read_text().splitlines(keepends=True)
    (path / RECORDS).write_text(lines[0] + "{broken\n" + lines[1])
    with pytest.raises(ValueError, match="line 2"):
        RunStore(path).records()


def test_compare_variants_share_problems_and_write_ratios(tmp_path):
    path = bench(tmp_path, "bench.compare=[baseline,P]", "generator.step_max_tokens=20")
    summary = json.loads((path / "summary.json").read_text())
    assert list(summary["variants"]) == ["baseline", "P"]
    rows = {row["metric"]: row for row in summary["ratios"]}
    goodput = rows["precise goodput (tok/s)"]
    assert goodput["P/baseline"] == pytest.approx(goodput["P"] / goodput["baseline"])
    ids = {v: [r["problem_id"] for r in RunStore(path).records() if r["variant"] == v] for v in ("baseline", "P")}
    assert ids["baseline"] == ids["P"]
    same = rows["final candidates = baseline's (share of problems)"]
    assert same["baseline"] == 1.0 and same["P"] == 1.0  # P reorders requests, the fake's tree is kept


def test_same_candidates_compares_texts_of_common_problems_in_any_order():
    from tts.results.summary import same_candidates

    def rec(variant, pid, *texts):
        return {"variant": variant, "problem_id": pid, "candidates": [{"text": t} for t in texts]}

    records = [rec("b", "1", "x", "y"), rec("b", "2", "x"), rec("b", "3", "z"),
               rec("v", "1", "y", "x"), rec("v", "2", "x", "x"), rec("v", "4", "z")]
    assert same_candidates(records, "b", "v") == 0.5  # 1 equal (order aside), 2 not; 3, 4 not in common
    assert same_candidates(records, "b", "b") == 1.0
    assert same_candidates(records, "b", "other") is None


def test_regrade_rebuilds_summary(tmp_path):
    from tts.cli_support import regrade

    path = bench(tmp_path)
    want = json.loads((path / "summary.json").read_text())["variants"]["baseline"]
    (path / "summary.json").unlink()
    assert regrade(path) == 0
    got = json.loads((path / "summary.json").read_text())["variants"]["baseline"]
    assert got["num_problems"] == 3
    # the step statistics come from the run folder (a killed run has no summary to keep them)
    for model in ("generator", "verifier"):
        assert got[model]["batch_util_hist"] == want[model]["batch_util_hist"], model
        assert got[model]["steps"] == want[model]["steps"], model
    assert got["generator"]["steps"] > 0


def test_a_run_killed_in_a_later_variant_keeps_the_summary_of_the_finished_ones(tmp_path):
    """A run that goes on across sessions of `--resume` writes its summary as each variant
    of the first round ends: killed during the third's first problem, it has the first two's
    tables with their ratios, and says what it still has to run; the resume's summary holds
    them all."""
    from tts.results.headline import headline

    class Killed(Exception):
        pass

    def kill_in_pms(variant, record):
        if variant == "PMS":
            raise Killed

    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=run",
                                    "bench.compare=[baseline,P,PMS]"])
    with pytest.raises(Killed):
        run_bench(cfg, progress=kill_in_pms)
    path = tmp_path / "run"
    summary = json.loads((path / "summary.json").read_text())
    assert list(summary["variants"]) == ["baseline", "P"]
    assert summary["pending"] == ["PMS", "rounds 2-3 of 3 (2 problems)"]  # one problem a round
    assert summary["variants"]["P"]["num_problems"] == 1 and summary["ratios"]
    assert summary["host"]["cores"] and (path / "summary.md").read_text().startswith(
        "incomplete: PMS, rounds 2-3 of 3 (2 problems) not run yet")
    assert headline(summary, RunStore(path).saved_config())[1].startswith("incomplete: PMS")
    bench(tmp_path, "bench.resume=true", "bench.compare=[baseline,P,PMS]")
    summary = json.loads((path / "summary.json").read_text())
    assert list(summary["variants"]) == ["baseline", "P", "PMS"] and summary["pending"] == []
    assert not any(line.startswith("incomplete") for line in headline(summary, RunStore(path).saved_config()))


def test_chunks_run_every_variant_before_the_next_and_records_carry_their_host(tmp_path):
    """`bench.chunk`: every variant runs a chunk's problems before the next chunk starts, in
    the listed order and then reversed (`bench.order=interleaved`), so
    a run resumed on another machine keeps each problem's variants on one host. Killed in
    the second chunk, the summary holds the first chunk's pairs and names what is left;
    every record says where it ran, and the resume finishes the chunk order."""

    class Killed(Exception):
        pass

    seen = []

    def kill_in_second_chunk(variant, record):
        seen.append((variant, record["problem_id"]))
        if len(seen) == 5:
            raise Killed

    args = FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=run", "bench.compare=[baseline,P]",
                   "dataset.first_k=4", "bench.chunk=2"]
    with pytest.raises(Killed):
        run_bench(compose("config", args), progress=kill_in_second_chunk)
    ids = ["embedded-1-0", "embedded-2-1", "embedded-3-2", "embedded-4-3"]
    # interleaved (the default): the second chunk runs the variants in reverse order
    assert seen == [("baseline", ids[0]), ("baseline", ids[1]), ("P", ids[0]), ("P", ids[1]), ("P", ids[2])]
    path = tmp_path / "run"
    summary = json.loads((path / "summary.json").read_text())
    assert [summary["variants"][v]["num_problems"] for v in ("baseline", "P")] == [2, 2]
    assert summary["pending"] == ["chunk 2 of 2 (2 problems)"] and summary["ratios"]
    run_bench(compose("config", args + ["bench.resume=true"]), progress=kill_in_second_chunk)
    assert seen[5:] == [("P", ids[3]), ("baseline", ids[2]), ("baseline", ids[3])]
    summary = json.loads((path / "summary.json").read_text())
    assert summary["pending"] == [] and summary["variants"]["P"]["num_problems"] == 4
    records = RunStore(path).records()
    assert all(r["host"]["cpu_model"] == summary["host"]["cpu_model"] for r in records)
    assert [{k: h[k] for k in ("cores", "records")} for h in summary["hosts"]] == [
        {"cores": summary["host"]["cores"], "records": 8}]


def test_a_run_on_several_hosts_says_so():
    """Records from two machines (a run resumed elsewhere) are counted per host, and the
    headline lists both; one host, or records from before hosts were recorded, say nothing."""
    from tts.results.host import hosts_lines, run_hosts

    amd = {"cpu_model": "AMD EPYC", "cores": 2, "native_bf16": False, "amx": False, "gpu": None,
           "dtype": {"generator": "float32"}, "torch": "2.13.0", "vllm": "0.32.0", "threads": 2}
    xeon = {**amd, "cpu_model": "Intel Xeon", "native_bf16": True, "amx": True}
    records = [{"host": amd}, {"host": {**amd, "threads": 3}}, {"host": xeon}, {}]
    hosts = run_hosts(records)
    assert [(h["cpu_model"], h["records"]) for h in hosts] == [("AMD EPYC", 2), ("Intel Xeon", 1)]
    lines = hosts_lines(hosts)
    assert lines[0].startswith("ran on 2 hosts") and "2 of 3 records on AMD EPYC" in lines[1]
    assert "1 of 3 records on Intel Xeon (2 cores, native bf16, AMX)" in lines[2]
    assert hosts_lines(run_hosts(records[:2])) == [] and hosts_lines(run_hosts([{}])) == []


def test_eval_of_a_run_killed_during_its_first_record_is_a_clear_error(tmp_path):
    """`kill -9` mid-write can leave records.jsonl holding only a torn line: `tts eval`
    names the file and the way on (--resume) instead of crashing; with whole records before
    the torn line it re-grades those."""
    from typer.testing import CliRunner

    from cli.main import app

    path = bench(tmp_path)
    lines = (path / RECORDS).read_text().splitlines(keepends=True)
    (path / RECORDS).write_text(lines[0][:50])
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "holds no complete record" in result.output and "--resume" in result.output
    (path / RECORDS).write_text(lines[0] + lines[1][:50])
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads((path / "summary.json").read_text())["variants"]["baseline"]["num_problems"] == 1


@pytest.mark.parametrize("arg", ["/no/such/folder", "./missing-run", "results/nope"])
def test_eval_of_a_missing_run_folder_says_so(arg):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["eval", arg])
    assert result.exit_code == 2
    assert f"{arg}: no such run folder" in result.output and "extraneous input" not in result.output


def test_every_run_records_its_host(tmp_path):
    from tts.results.host import host_line

    path = bench(tmp_path)
    host = json.loads((path / "summary.json").read_text())["host"]
    assert host["dtype"] == {"generator": "fake", "verifier": "fake"} and host["sampler"] == "position"
    assert host["cores"] >= 1 and host["threads"] >= 1 and isinstance(host["native_bf16"], bool)
    assert host["cpu_model"] and host["torch"]
    line = host_line(host)
    assert line.startswith(f"host: {host['cpu_model']} (") and "dtype generator fake" in line
    assert host["model_runner"] is None and "model runner" not in line  # no vLLM engine ran
    assert "; vLLM model runner V1; " in host_line({**host, "model_runner": "V1"})


def test_the_host_line_keeps_to_its_width_on_any_host():
    """The headline's host line breaks between its parts at 160 characters: every test sees
    the made-up host of tests/conftest.py, named longer than any real CPU, and a run on a GPU
    with every part recorded is the longest line there is; joined back, it is the one line."""
    from tests.conftest import TEST_CPU
    from tts.results.headline import WIDTH
    from tts.results.host import cpu_model, host_line, host_lines

    assert cpu_model() == TEST_CPU  # the fixture holds, so no test reads this machine's CPU
    host = {"cpu_model": cpu_model(), "cores": 192, "native_bf16": False, "amx": False,
            "gpu": "NVIDIA H100 80GB HBM3", "dtype": {"generator": "bfloat16", "verifier": "bfloat16"},
            "sampler": "position", "model_runner": "V1", "torch": "2.13.0+cu128", "vllm": "0.32.0", "threads": 192}
    lines = host_lines(host, WIDTH)
    assert len(lines) >= 2 and all(len(line) <= WIDTH for line in lines)
    assert lines[0].startswith(f"host: {TEST_CPU} (192 cores") and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == host_line(host)
    assert host_lines(host, 10_000) == [host_line(host)]  # one line where it fits
    assert all(len(line) <= 40 for line in host_lines({**host, "cpu_model": "x" * 90}, 40))  # even one long part


def test_report_warns_when_hosts_or_dtypes_differ(tmp_path):
    from tts.report import write_report

    a, b = bench(tmp_path, name="a"), bench(tmp_path, name="b")
    same = json.loads((write_report([str(a), str(b)], out=tmp_path / "r1").parent / "report.json").read_text())
    assert same["host_warnings"] == []
    summary = json.loads((b / "summary.json").read_text())
    summary["host"]["dtype"]["generator"] = "bfloat16"
    summary["host"]["cpu_model"] = "Another CPU"
    (b / "summary.json").write_text(json.dumps(summary))
    report = write_report([str(a), str(b)], out=tmp_path / "r2")
    warnings = json.loads((report.parent / "report.json").read_text())["host_warnings"]
    assert any(w.startswith("cpu_model differs") for w in warnings)
    assert any(w.startswith("dtype differs") for w in warnings)
    assert "different hosts or dtypes" in report.read_text()


def test_run_completes_when_wandb_is_unavailable(tmp_path, monkeypatch):
    import wandb

    def broken(*args, **kwargs):
        raise RuntimeError("no W&B here")

    monkeypatch.setattr(wandb, "init", broken)
    cfg = compose("config", [o for o in FAKE if o != "logger=none"] +
                  ["logger=wandb", "logger.mode=offline", f"bench.results_dir={tmp_path}", "bench.run_name=w"])
    with pytest.warns(UserWarning, match="W&B unavailable"):
        path = run_bench(cfg)
    assert len(RunStore(path).records()) == 3 and (path / "summary.json").exists()


def test_wandb_mode_comes_from_config_then_env(monkeypatch, tmp_path):
    from tts.wandb_sink import RunLogger

    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert RunLogger(True, None, "p", None, [], tmp_path, {}, "n").mode == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert RunLogger(False, None, "p", None, [], tmp_path, {}, "n").mode == "offline"
    assert RunLogger(False, "online", "p", None, [], tmp_path, {}, "n").mode == "online"


def test_throughput_is_over_the_variant_wall_time_less_its_tails(tmp_path):
    """With problems in flight together, per-problem latencies overlap: problems/min and
    tokens/s come from the variant's wall clock, which the records carry, less the empty
    slots of the tail where fewer than bench.concurrency were left in flight."""
    from tts.metrics.cost_model import tail_forfeit

    path = bench(tmp_path, "bench.concurrency=3")
    records = RunStore(path).records()
    walls = [r["variant_wall_s"] for r in records]
    assert walls == sorted(walls) and walls[0] > 0
    s = json.loads((path / "summary.json").read_text())["variants"]["baseline"]
    assert s["wall_s"] == walls[-1]
    tail, forfeit = tail_forfeit([(r["variant_wall_s"] - r["metrics"]["latency_s"], r["variant_wall_s"])
                                  for r in records], 3)
    assert (s["tail_s"], s["tail_forfeit_s"]) == (tail, forfeit) and 0 < forfeit < tail <= walls[-1]
    tokens = sum(r["metrics"]["gen_tokens"] for r in records)
    assert s["problems_per_min"] == pytest.approx(60 * 3 / (walls[-1] - forfeit))
    assert s["tokens_per_s"] == pytest.approx(tokens / (walls[-1] - forfeit))
    assert s["problems_per_min_wall"] == pytest.approx(60 * 3 / walls[-1])
    assert s["tokens_per_s_wall"] == pytest.approx(tokens / walls[-1])
    assert walls[-1] < sum(r["metrics"]["latency_s"] for r in records)  # overlapping latencies


def _slots(latencies: list[float], concurrency: int, chunk: int) -> list[tuple[float, float]]:
    """(start, end) of each problem when `concurrency` slots take them in order, a chunk at a
    time (the next chunk starts when the last one's last problem ends)."""
    spans, t0 = [], 0.0
    for c in range(0, len(latencies), chunk):
        free = [t0] * concurrency
        for lat in latencies[c:c + chunk]:
            start = min(free)
            free[free.index(start)] = start + lat
            spans.append((start, start + lat))
        t0 = max(free)
    return spans


def test_a_variant_whose_problems_vary_is_not_slower_for_its_tails(tmp_path):
    """Two variants of equal throughput: with two slots, one's problems take 10 s each, the
    other's 5 s and 15 s in turn. Over a chunk of four, the first fills its slots to the end
    (40 s for 8 problems); the second waits 10 s on its last 15 s problem with one slot
    empty (50 s). Their problems/min ratio is 1, the true one; over the wall time it would
    read 0.8, the tails'."""
    from tts.results.summary import write_summary

    path = bench(tmp_path, "bench.compare=[baseline,baseline@vary]", "bench.concurrency=2", "bench.chunk=4",
                 "dataset.first_k=8")
    store = RunStore(path)
    records = store.records()
    timings = {"baseline": [10.0] * 8, "baseline@vary": [5.0, 15.0] * 4}
    for name, latencies in timings.items():
        mine = sorted((r for r in records if r["variant"] == name), key=lambda r: r["problem_id"])
        for r, lat, (_, end) in zip(mine, latencies, _slots(latencies, 2, 4)):
            r["metrics"]["latency_s"], r["variant_wall_s"] = lat, end
    (path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    summary, _ = write_summary(store, list(timings), {}, plots=False)
    even, vary = summary["variants"]["baseline"], summary["variants"]["baseline@vary"]
    assert (even["wall_s"], vary["wall_s"]) == (40.0, 50.0)
    assert (even.get("tail_forfeit_s", 0.0), vary["tail_forfeit_s"]) == (0.0, 10.0)
    assert even["problems_per_min"] == vary["problems_per_min"] == pytest.approx(12.0)
    assert vary["problems_per_min_wall"] == pytest.approx(9.6)
    # the cross-check over full-slot time only: 15 s of each chunk, 3 problems and a third
    # of the 15 s one done in them (it credits that one evenly, though it ran alone at the end)
    assert even["problems_per_min_busy"] == pytest.approx(12.0)
    assert vary["problems_per_min_busy"] == pytest.approx(60 * (3 + 1 / 3) / 15)
    row = next(r for r in summary["ratios"] if r.get("key") == "problems_per_min")
    assert row["baseline@vary/baseline"] == pytest.approx(1.0)
    low, high = row["baseline@vary/baseline_ci"]
    assert low <= 1.0 <= high


def test_variants_interleave_one_problem_at_a_time_in_turn_and_a_copy_is_a_control(tmp_path):
    """At concurrency 1 without chunks, the variants take turns problem by problem, the order
    reversed each round (A B, B A, ...); `NAME@COPY` runs a preset again under its own name
    (an A/A control): on the fake backend it grows the same trees. `sequential` keeps the
    listed order over all problems."""
    seen = []
    path = bench(tmp_path, "bench.compare=[baseline,baseline@copy]", "dataset.first_k=3",
                 progress=lambda v, r: seen.append((v, r["problem_id"][-1])))
    assert seen == [("baseline", "0"), ("baseline@copy", "0"), ("baseline@copy", "1"), ("baseline", "1"),
                    ("baseline", "2"), ("baseline@copy", "2")]
    summary = json.loads((path / "summary.json").read_text())
    assert summary["variants"]["baseline@copy"]["same_candidates"] == 1.0
    seen.clear()
    bench(tmp_path, "bench.compare=[baseline,P]", "dataset.first_k=2", "bench.order=sequential", name="seq",
          progress=lambda v, r: seen.append((v, r["problem_id"][-1])))
    assert seen == [("baseline", "0"), ("baseline", "1"), ("P", "0"), ("P", "1")]


@pytest.mark.parametrize("compare, says", [
    ("[baseline,baseline]", "baseline listed twice; to run a preset again (an A/A control) give the copy its "
                            "own name: baseline@copy"),
    ("[baseline,baseline@a-b]", "'baseline@a-b': after @ comes the copy's name"),
    ("[baseline,nope@copy]", "unknown optim preset 'nope'")])
def test_a_copy_needs_its_own_name(tmp_path, compare, says):
    from tts.config.compose import ConfigError

    with pytest.raises(ConfigError, match=re.escape(says)):
        bench(tmp_path, f"bench.compare={compare}")


def test_hit_rates_are_unknown_without_the_count_or_anything_made_ahead():
    from tts.metrics.measures import ProblemMetrics, summarize_problems

    m = ProblemMetrics("p", lookahead_scored=8, lookahead_used=2)
    m.beam_tokens, m.beam_completion_s = [10], [1.0]
    new = m.to_dict()
    assert new["lookahead_hit_rate"] == 0.25
    assert summarize_problems([new, new])["lookahead_hit_rate"] == 0.25
    old = {k: v for k, v in new.items() if k not in ("lookahead_used", "lookahead_hit_rate")}
    assert summarize_problems([new, old])["lookahead_hit_rate"] is None  # not a rate of 0
    none = ProblemMetrics("q")  # nothing made ahead: no rate (the baseline's), not 0
    none.beam_tokens, none.beam_completion_s = [10], [1.0]
    d = none.to_dict()
    assert d["lookahead_hit_rate"] is None and d["spec_hit_rate"] is None
    summary = summarize_problems([d, d])
    assert summary["lookahead_hit_rate"] is None and summary["spec_hit_rate"] is None
    assert summarize_problems([new, d])["lookahead_hit_rate"] == 0.25


def test_kv_block_counts_add_up_across_a_resume_and_reach_the_ratio_table():
    from tts.metrics.measures import merge_step_logs
    from tts.results.ratios import format_table, ratio_table
    from tts.results.summary import variant_summary

    step = {"batch_util_mean": 0.5, "running_mean": 2.0}
    killed = {"generator": step, "kv_blocks": {"generator": {"thrash_blocks": 3, "evictions": 10, "hits": 7}}}
    resumed = {"generator": step, "kv_blocks": {"generator": {"thrash_blocks": 4, "evictions": 1, "hits": 2},
                                                "verifier": {"thrash_blocks": 0, "evictions": 0, "hits": 5}}}
    merged = merge_step_logs(killed, resumed)["kv_blocks"]
    assert merged == {"generator": {"thrash_blocks": 7, "evictions": 11, "hits": 9},
                      "verifier": {"thrash_blocks": 0, "evictions": 0, "hits": 5}}
    assert merge_step_logs(None, resumed)["kv_blocks"] == resumed["kv_blocks"]
    assert "kv_blocks" not in merge_step_logs(None, {"generator": step})  # the fake backend: none
    base = variant_summary([], {"generator": step, "kv_blocks": merged}, None)
    assert (base["gen_thrash_blocks"], base["gen_evictions"], base["ver_thrash_blocks"]) == (7, 11, 0)
    other = variant_summary([], {"generator": step, "kv_blocks": {"generator": {"thrash_blocks": 14, "evictions": 22},
                                                                 "verifier": {"thrash_blocks": 3, "evictions": 3}}}, None)
    rows = {r["metric"]: r for r in ratio_table({"a": base, "b": other}, "a")}
    assert rows["generator KV blocks recomputed after eviction (thrash)"]["b/a"] == 2.0
    assert rows["generator KV blocks evicted"]["b/a"] == 2.0
    verifier = rows["verifier KV blocks recomputed after eviction (thrash)"]
    assert verifier["b"] == 3 and "b/a" not in verifier  # no ratio to a count of 0
    assert "| verifier KV blocks recomputed after eviction (thrash) | 0 | 3 | - |" in format_table(
        list(rows.values()), ["a", "b"], "a")
    fake = variant_summary([], {"generator": step}, None)
    assert "gen_thrash_blocks" not in fake


def test_cost_sums_add_up_across_a_resume_and_bound_each_variant():
    """The step cost model's sums of a killed run and its resume add up; the run's fit
    (every variant's steps) bounds each variant's work, and the table shows the bound."""
    from tts.backends.base import StepStats
    from tts.metrics.measures import StepLog, merge_step_logs
    from tts.results.ratios import ratio_table
    from tts.results.summary import add_bounds, cost_models, variant_summary

    def log(steps):
        g = StepLog()
        for decode, prefill in steps:
            per = (1,) * decode + ((prefill,) if prefill else ())
            g.observe(StepStats(len(per), 0, decode + prefill, 16, 2048, 0.0,
                                0.05 + 0.004 * decode + 0.002 * prefill, per))
        return g.summary()

    killed = {"generator": log([(4, 0), (8, 0), (2, 100)])}
    resumed = {"generator": log([(16, 0), (1, 0), (0, 300)])}
    merged = merge_step_logs(killed, resumed)["generator"]["cost"]
    assert merged["steps"] == 6 and merged["xtx"][1][1] == 16 + 64 + 4 + 256 + 1  # decode sequences, squared
    assert merged["wall_s"] == pytest.approx(killed["generator"]["cost"]["wall_s"] + resumed["generator"]["cost"]["wall_s"])
    metrics = {"latency_s": 10.0, "generator_s": 10.0, "verifier_s": 0.0, "iterations": 1, "gen_tokens": 210,
               "gen_requests": 10, "gen_prompt_tokens": 1000, "gen_cached_tokens": 900, "beam_tokens": [100, 60],
               "beam_completion_s": [10.0, 10.0], "step_tokens_mean": [20], "step_tokens_max": [30],
               "straggler_gap": 1.5, "spec_generated": 0, "spec_used": 0}
    record = {"metrics": metrics, "candidates": [], "correct": {}, "pass@n": 0.0}
    summaries = {"a": variant_summary([record], merge_step_logs(killed, resumed), None),
                 "b": variant_summary([dict(record, metrics=dict(metrics, gen_tokens=110, latency_s=5.0))],
                                      {"generator": log([(8, 0), (12, 0), (3, 50)])}, None)}
    models = cost_models(summaries)
    gen = models["generator"]
    assert (gen.step_s, gen.per_decode_seq_s, gen.per_prefill_token_s) == pytest.approx((0.05, 0.004, 0.002))
    assert models["verifier"] is None  # no verifier steps logged
    for name in summaries:
        add_bounds(summaries[name], [record] if name == "a" else [], models)
    a = summaries["a"]  # 200 decode sequences, 100 prefill tokens, a 100-token longest path
    assert a["gen_bound_s_mean"] == pytest.approx(0.05 * 100 + 0.004 * 200 + 0.002 * 100)
    assert a["latency_bound_s_mean"] == a["gen_bound_s_mean"]  # no verifier work
    assert a["bound_share"] == pytest.approx(a["latency_bound_s_mean"] / 10.0)
    assert a["wall_bound_s"] == pytest.approx(a["latency_bound_s_mean"])  # one problem
    assert a["problems_per_min_bound"] == pytest.approx(60.0 / a["wall_bound_s"])
    assert "latency_bound_s_mean" not in summaries["b"]  # no records: no bound
    assert (a["tree_bound_s_mean"], a["tree_bound_share"], a["tree_problems_per_min_bound"]) == pytest.approx(
        (a["latency_bound_s_mean"], a["bound_share"], a["problems_per_min_bound"]))  # nothing speculated
    wasteful = dict(record, metrics=dict(metrics, spec_generated=80, spec_used=20))  # 60 of the 200 unadopted
    c = variant_summary([wasteful], merge_step_logs(killed, resumed), None)
    add_bounds(c, [wasteful], models)
    assert c["latency_bound_s_mean"] == pytest.approx(a["latency_bound_s_mean"])
    assert c["tree_bound_s_mean"] == pytest.approx(0.05 * 100 + 0.004 * 140 + 0.002 * 100)
    assert c["tree_bound_share"] == pytest.approx(c["tree_bound_s_mean"] / 10.0) and c["tree_bound_share"] < a["bound_share"]
    rows = {r["metric"]: r for r in ratio_table(summaries, "a")}
    assert rows["completion latency lower bound, same work (s)"]["a"] == a["latency_bound_s_mean"]


@pytest.mark.parametrize("optim", ["baseline", "decoupled"])
def test_each_search_iteration_reaches_the_progress_display(tmp_path, optim):
    """`on_iteration(variant, problem, done)` counts each problem's iterations 1, 2, ... up
    to the count its record keeps (what the progress bar shows on long problems)."""
    seen: dict[tuple[str, str], list[int]] = {}
    cfg = compose("config", FAKE + [f"bench.results_dir={tmp_path}", "bench.run_name=it", f"optim={optim}"])
    path = run_bench(cfg, on_iteration=lambda v, pid, done: seen.setdefault((v, pid), []).append(done))
    records = RunStore(path).records()
    assert {(r["variant"], r["problem_id"]) for r in records} == set(seen)
    for r in records:
        assert seen[(r["variant"], r["problem_id"])] == list(range(1, r["metrics"]["iterations"] + 1))


def test_a_verifier_vllm_cannot_serve_from_the_cache_says_so_instead_of_a_zero_hit_rate(tmp_path):
    """Math-Shepherd reads prompt log-probs, which vLLM 0.32 computes for every position: its
    hit rate is not 0 (a cold cache), it does not exist. The fake run is re-summarised as if
    its config named that verifier on vLLM."""
    import yaml

    from tts.results.summary import NOT_CACHED, write_summary

    path = bench(tmp_path, "bench.compare=[baseline,P]")
    store = RunStore(path)
    config = store.saved_config()
    summary, _ = write_summary(store, ["baseline", "P"], store.step_logs(), None)
    assert isinstance(summary["variants"]["P"]["ver_cache_hit_rate"], float)  # the fake's own
    config["verifier"].update(backend="vllm", adapter="math_shepherd")
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    summary, _ = write_summary(store, ["baseline", "P"], store.step_logs(), None)
    assert all(v["ver_cache_hit_rate"] is None and v["ver_cache_hit_rate_note"] == NOT_CACHED
               for v in summary["variants"].values())  # no number, and the reason beside it
    row = next(r for r in summary["ratios"] if r["metric"] == "verifier prefix-cache hit rate")
    assert row["P"] is None and row["P_note"] == NOT_CACHED and "P/baseline" not in row  # a number field
    assert f"| verifier prefix-cache hit rate | {NOT_CACHED} | {NOT_CACHED} | - |" in summary["ratio_table_md"]


def test_a_warm_up_problem_runs_first_and_leaves_no_trace(tmp_path, monkeypatch):
    """`bench.warmup=1`: the first variant runs the first problem once before the first
    round, on the engines the run keeps; no record, trace entry or step statistic comes of
    it. A resume with nothing left to run warms nothing up."""
    from tts.bench.loop import WARM_UP_ITERATIONS
    from tts.engine.engine import Engine
    from tts.trace.format import TRACE, read_trace

    ran, iterations = [], []
    real = Engine.run

    def counting(self, problems):
        for outcome in real(self, problems):
            ran.append(outcome.problem.id)
            iterations.append(outcome.metrics.iterations)
            yield outcome

    monkeypatch.setattr(Engine, "run", counting)
    path = bench(tmp_path, "bench.compare=[baseline,P]", "dataset.first_k=2", "bench.warmup=1")
    assert ran == ["embedded-1-0"] * 3 + ["embedded-2-1"] * 2  # the warm-up, then A B, B A
    assert iterations[0] <= WARM_UP_ITERATIONS < max(iterations[1:])  # the warm-up's search is cut short
    records = RunStore(path).records()
    assert [(r["variant"], r["problem_id"]) for r in records] == [
        ("baseline", "embedded-1-0"), ("P", "embedded-1-0"), ("P", "embedded-2-1"), ("baseline", "embedded-2-1")]
    unwarmed = bench(tmp_path, "bench.compare=[baseline,P]", "dataset.first_k=2", "bench.warmup=0", name="cold")
    steps = lambda p: json.loads((p / "step_logs.json").read_text())["baseline"]["generator"]["steps"]  # noqa: E731
    assert steps(path) == steps(unwarmed)  # its steps are not the variant's
    trace = read_trace(path / TRACE)
    assert trace.drift("baseline", "P") == read_trace(unwarmed / TRACE).drift("baseline", "P")
    ran.clear()
    bench(tmp_path, "bench.compare=[baseline,P]", "dataset.first_k=2", "bench.resume=true")
    assert ran == []


def test_batch_utilisation_compares_only_under_one_cap():
    """A utilisation divides by the variant's own batch cap: between variants under different
    caps the table gives no ratio and names both caps (requests per step compare instead);
    under one cap the ratio stands."""
    from tts.results.ratios import format_table, ratio_table

    base = {"gen_batch_util_mean": 0.07, "gen_batch_cap": 64, "gen_running_mean": 4.46}
    pms = {"gen_batch_util_mean": 0.712, "gen_batch_cap": 8, "gen_running_mean": 5.70}
    rows = {r["key"]: r for r in ratio_table({"baseline": base, "PMS": pms}, "baseline") if "key" in r}
    util = rows["gen_batch_util_mean"]
    assert "PMS/baseline" not in util and util["PMS/baseline_note"] == "n/a (caps 8 and 64: see requests per step)"
    assert rows["gen_running_mean"]["PMS/baseline"] == pytest.approx(5.70 / 4.46)
    assert "n/a (caps 8 and 64" in format_table(list(rows.values()), ["baseline", "PMS"], "baseline")
    same = {r["key"]: r for r in ratio_table({"baseline": base, "PMS": {**pms, "gen_batch_cap": 64}}, "baseline")
            if "key" in r}
    assert same["gen_batch_util_mean"]["PMS/baseline"] == pytest.approx(0.712 / 0.07)
