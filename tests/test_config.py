"""Config composition, validation errors, sweeps, and the CLI's config handling."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli.main import app
from omegaconf import OmegaConf

from tts.config.compose import CONF_DIR, ConfigError, compose, expand_sweep, validate
from tts.config.enums import Algorithm
from tts.config.schema import GROUPS, Config

runner = CliRunner()


def test_default_config_composes_to_the_schema():
    cfg = validate(compose("config"))
    assert isinstance(cfg, Config)
    assert cfg.search.algorithm == Algorithm.beam.value and (cfg.search.n, cfg.search.beam_width) == (8, 4)
    assert cfg.generator.model == "smollm2-135m-instruct" and cfg.verifier.adapter.value == "judge"
    assert cfg.dataset.name.value == "embedded"


@pytest.mark.parametrize("override,needle", [
    ("search.foo=1", "unknown config key 'search.foo'; valid keys: algorithm, n, beam_width"),
    ("search=nope", "Available options in 'search'"),
    ("search.algorithm=xx", "search.algorithm: unknown 'xx' (not a built-in, nor an installed package's entry "
                            "point in tts.search_algorithms); valid choices: beam, dvts, best_of_n"),
    ("search.n=10", "search.n: n=10 must be divisible by search.beam_width=4"),
    ("optim.lookahead=true", "optim.lookahead: needs optim.speculative=true"),
    ("memory.block_size=16", "memory.block_size: 16 is not a multiple of 32"),
    ("logger.mode=loud", "logger.mode: valid choices: online, offline, disabled"),
    ("generator.sampler=gumbel", "expected one of [auto, position, vllm]"),
    ("optim.lookahead_scope=some", "expected one of [auto, all, kept]"),
])
def test_bad_config_names_field_and_choices(override, needle):
    with pytest.raises(ConfigError) as err:
        compose("config", [override])
    assert needle in str(err.value)


def test_cli_bad_config_exits_2_with_message():
    result = runner.invoke(app, ["bench", "search.algorithm=nope"])
    assert result.exit_code == 2
    assert "search.algorithm" in result.output and "dvts" in result.output


def test_cli_prints_composed_config():
    result = runner.invoke(app, ["bench", "--cfg", "search.n=16"])
    assert result.exit_code == 0, result.output
    assert "'n': 16" in result.output and "algorithm: beam" in result.output


def test_sweep_expansion_is_the_product():
    combos = expand_sweep(["search.n=4,8", "optim=baseline,PMS", "dataset.first_k=2"])
    assert combos == [
        ["search.n=4", "optim=baseline", "dataset.first_k=2"],
        ["search.n=4", "optim=PMS", "dataset.first_k=2"],
        ["search.n=8", "optim=baseline", "dataset.first_k=2"],
        ["search.n=8", "optim=PMS", "dataset.first_k=2"],
    ]


def test_sweep_job_folders_are_named_by_what_they_sweep():
    from tts.cli_support import compose_jobs

    jobs = compose_jobs("config", ["search.n=4,8", "logger=none", "bench.run_name=sw"], True, False)
    assert [j.cfg.bench.run_name for j in jobs] == ["sw/0_search.n=4", "sw/1_search.n=8"]


def test_cli_multirun_prints_one_config_per_job():
    result = runner.invoke(app, ["bench", "-m", "--cfg", "search.n=4,8"])
    assert result.exit_code == 0, result.output
    assert result.output.count("# overrides:") == 2


def test_sweep_without_m_is_refused():
    result = runner.invoke(app, ["bench", "search.n=4,8"])
    assert result.exit_code == 2 and "add -m" in result.output


OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((CONF_DIR / group).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_composes_to_its_file(group, option):
    cfg = compose("config", [f"{group}={option}"])
    validate(cfg)
    for key, value in OmegaConf.load(CONF_DIR / group / f"{option}.yaml").items():
        if key == "defaults":  # memory/auto.yaml: cpu.yaml's values (the memory tests below)
            continue
        composed = OmegaConf.select(cfg, f"{group}.{key}")
        assert str(composed) == str(value) or composed == value, (group, option, key)


def test_presets_compose():
    for name in ("compare", "throughput", "baseline_profile", "eval", "prefix_effect"):
        validate(compose(name))
    pms = validate(compose("config", ["optim=PMS"]))
    assert pms.optim.speculative and pms.optim.lookahead and pms.optim.prefix_aware and pms.optim.roofline_memory


def test_help_imports_nothing_heavy():
    code = ("import sys; from typer.testing import CliRunner; from cli.main import app; "
            "CliRunner().invoke(app, ['--help']); "
            "print(sorted(m for m in ('torch', 'vllm', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("sampler,mode", [("position", "context"), ("vllm", "stream"), ("auto", "context")])
def test_fake_generator_follows_the_sampler(sampler, mode):
    """The fake backend's sampling modes are the two samplers' semantics."""
    from tts.backends.factory import Backends, static_split
    from tts.config.compose import validate

    cfg = validate(compose("config", ["generator.backend=fake", "verifier.backend=fake",
                                      f"generator.sampler={sampler}"]))
    gen, _ = Backends(cfg).get(*static_split(cfg))
    assert gen.sampling == mode and gen.resumable_sampling == (mode == "context")


def test_optim_overrides_apply_to_every_compare_variant():
    """With `bench.compare`, the variants are presets; the command line's `optim.*`
    overrides go on top of each, and one that breaks a variant names it."""
    from tts.config.compose import validate
    from tts.assembly.variants import variant_optims

    cfg = validate(compose("compare", ["optim.spec_truncate_ratio=0", "bench.compare=[baseline,PMS,PMS_branches]"]))
    assert cfg.bench.optim_overrides == ["spec_truncate_ratio=0"]
    variants = dict(variant_optims(cfg))
    assert {v.spec_truncate_ratio for v in variants.values()} == {0.0}
    assert variants["PMS_branches"].spec_rule == "branches" and not variants["baseline"].speculative
    assert dict(variant_optims(validate(compose("compare", []))))["PMS"].spec_truncate_ratio == 0.85
    both = dict(variant_optims(validate(compose("compare", ["bench.compare=[PMS_branches_prune]"]))))
    assert both["PMS_branches_prune"].spec_rule == "branches" and both["PMS_branches_prune"].spec_prune
    # valid for PMS, not for the baseline preset; the top-level optim (baseline here) is not run
    with pytest.raises(ConfigError, match="variant 'baseline'.*lookahead"):
        compose("compare", ["optim.lookahead=true", "bench.compare=[PMS,baseline]"])
    only_pms = validate(compose("compare", ["optim=PMS", "optim.lookahead=false", "bench.compare=[PMS]"]))
    assert only_pms.bench.optim_overrides == ["lookahead=false"]  # the group choice is not one
    assert not dict(variant_optims(only_pms))["PMS"].lookahead
    fine = validate(compose("compare", ["optim.lookahead=false", "bench.compare=[PMS,PMS_exact]"]))
    assert [v.lookahead for _, v in variant_optims(fine)] == [False, False]
    with pytest.raises(ConfigError, match="unknown optim preset 'PMX'.*PMS_exact"):
        compose("compare", ["bench.compare=[baseline,PMX]"])
    with pytest.raises(ConfigError, match="spec_truncate_ratio"):
        compose("compare", ["optim.spec_truncate_ratio=2"])


@pytest.mark.parametrize("overrides, name", [
    (["optim=PMS_exact"], "PMS_exact"),  # not "PMS": the variant says which preset ran
    (["optim=decoupled_all"], "decoupled_all"),
    (["optim=PMS", "optim.spec_truncate_ratio=0.5"], "PMS"),  # no preset: the switches
    (["optim=decoupled", "optim.decoupled_policy=adaptive"], "decoupled-adaptive"),
])
def test_a_single_variant_is_named_after_its_preset(overrides, name):
    from tts.config.compose import validate
    from tts.assembly.variants import variant_optims

    assert [n for n, _ in variant_optims(validate(compose("config", overrides)))] == [name]


def test_the_main_job_compares_and_an_engine_on_the_command_line_runs_alone():
    from tts.cli_support import compose_jobs

    assert list(compose_jobs("main", [], False, False)[0].cfg.bench.compare) == ["baseline", "PMS"]
    alone = compose_jobs("main", ["optim=PMS"], False, False)[0].cfg
    assert list(alone.bench.compare) == [] and alone.optim.speculative
    chosen = compose_jobs("main", ["optim=PMS", "bench.compare=[baseline,P]"], False, False)[0].cfg
    assert list(chosen.bench.compare) == ["baseline", "P"]
    tweaked = compose_jobs("main", ["optim.spec_truncate_ratio=0.5"], False, False)[0].cfg
    assert list(tweaked.bench.compare) == ["baseline", "PMS"]  # optim.* goes on top of every variant


def test_an_empty_dataset_file_fails_before_any_progress_bar(tmp_path):
    """An empty JSONL file is named as such (not "the subset selects no problems"), and the
    run stops before the progress bars are drawn or any engine starts."""
    empty = tmp_path / "math500.jsonl"
    empty.write_text("\n\n")
    result = runner.invoke(app, ["bench", "generator=fake", "verifier=fake", "logger=none", "dataset=math500",
                                 f"dataset.path={empty}", f"bench.results_dir={tmp_path}"])
    assert result.exit_code == 2
    # the message wraps at the terminal's width, inside the path or at a space: compare without whitespace
    expected = f"{empty}: no problems in the file (empty, or only blank lines)"
    assert "".join(expected.split()) in "".join(result.output.split())
    assert "━" not in result.output and "baseline" not in result.output
    assert not list(tmp_path.glob("*/records.jsonl"))


def test_bars_count_only_the_problems_that_run(tmp_path, monkeypatch):
    """The progress bars' totals are the problems whose prompts fit (a skipped one is not
    counted), times the seeds; a resume counts its finished ones as done."""
    from tts import cli_support, problems

    real = problems.fit_prompts

    def skip_the_first(cfg, selected):
        kept, skipped = real(cfg, selected)
        return kept[1:], skipped + [{"problem_id": kept[0].id, "prompt_tokens": 9999, "limit": 512,
                                     "reason": "too long (test)"}]

    monkeypatch.setattr("tts.runner.fit_prompts", skip_the_first)
    plans = []
    real_search = cli_support._run_search

    def spy(fn, cfg, term, on_folder):
        def recording(*a, on_plan, **k):
            return fn(*a, on_plan=lambda runs: (plans.append(runs), on_plan(runs)), **k)
        return real_search(recording, cfg, term, on_folder)

    monkeypatch.setattr(cli_support, "_run_search", spy)
    args = ["bench", "generator=fake", "verifier=fake", "logger=none", "dataset.first_k=3", "search.n=4",
            "search.beam_width=2", "bench.seeds=[0,1]", "bench.compare=[baseline,P]",
            f"bench.results_dir={tmp_path}", "bench.run_name=r"]
    assert runner.invoke(app, args).exit_code == 0
    assert plans == [{"baseline": (4, 0), "P": (4, 0)}]  # 2 problems that fit x 2 seeds
    assert runner.invoke(app, args + ["--resume", "bench.seeds=[0,1,2]"]).exit_code == 0
    assert plans[1] == {"baseline": (6, 4), "P": (6, 4)}


@pytest.fixture
def cuda(monkeypatch):
    """A host where torch sees a CUDA card (no GPU here: torch is told so)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def jobs_here(overrides: list[str], caplog) -> tuple[list, list[str]]:
    """The CLI's composed jobs (`tts bench ...` without -m) and the lines composing logged."""
    import logging

    from tts.cli_support import compose_jobs

    with caplog.at_level(logging.WARNING, logger="tts.config.compose"):
        jobs = compose_jobs("config", overrides, False, False)
    return [validate(j.cfg).memory for j in jobs], [r.getMessage() for r in caplog.records]


def test_memory_left_at_its_default_takes_the_gpu_settings_on_a_cuda_host(cuda, caplog):
    (memory,), lines = jobs_here([], caplog)
    assert memory == validate(compose("config", ["memory=gpu"])).memory
    assert (memory.gpu_free_fraction, memory.generator_max_num_seqs, memory.max_num_batched_tokens) == (0.9, 256, 8192)
    assert lines == ["memory=auto: the models run on a CUDA GPU, so this run takes memory=gpu's settings "
                     "(conf/memory/gpu.yaml); give memory=cpu or memory=tight to choose another"]
    caplog.clear()
    (memory,), lines = jobs_here(["memory.kv_cache_gib=2", "memory.generator_max_num_seqs=32"], caplog)
    assert (memory.gpu_free_fraction, memory.kv_cache_gib, memory.generator_max_num_seqs) == (0.9, 2.0, 32)
    assert len(lines) == 1  # the command line's memory keys go on top of the GPU's settings


@pytest.mark.parametrize("choice", ["cpu", "tight"])
def test_a_memory_config_chosen_is_kept_on_a_cuda_host(cuda, caplog, choice):
    (memory,), lines = jobs_here([f"memory={choice}"], caplog)
    assert memory == validate(compose("config", [f"memory={choice}"])).memory and memory.gpu_free_fraction is None
    assert lines == []


def test_memory_left_at_its_default_is_the_cpus_where_no_model_runs_on_a_gpu(monkeypatch, caplog):
    import torch

    cpu = validate(compose("config", ["memory=cpu"])).memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert jobs_here([], caplog) == ([cpu], [])  # a CPU host
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert jobs_here(["generator=fake", "verifier=fake"], caplog) == ([cpu], [])  # no model runs on the card
