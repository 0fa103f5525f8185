"""Engine lengths against the models' contexts: the registry's limits, every config in conf/
with every generator and verifier that can pair with it, and the errors a length that does
not fit gives before anything is downloaded."""

import dataclasses
import json

import pytest
from omegaconf import OmegaConf

from tts.config.compose import CONF_DIR, ConfigError, compose, validate
from tts.config.limits import PROMPT_ROOM, check_context, engine_length, model_context
from tts.models.registry import REGISTRY, find_spec

CONFIGS = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
GENERATORS = sorted(p.stem for p in (CONF_DIR / "generator").glob("*.yaml") if p.stem != "fake")
VERIFIERS = sorted(p.stem for p in (CONF_DIR / "verifier").glob("*.yaml") if p.stem != "fake")


def test_every_registry_model_knows_its_context_and_each_generator_limit_fits_every_verifier():
    smallest_verifier = min(s.context_length for s in REGISTRY.values() if s.role in ("verifier", "both"))
    assert smallest_verifier == 4096
    for spec in REGISTRY.values():
        assert spec.context_length > 0, spec.key
        if spec.limits is None:
            continue
        length = PROMPT_ROOM + spec.limits.max_total_tokens + 2 * spec.limits.step_max_tokens
        assert spec.limits.step_max_tokens <= spec.limits.max_total_tokens, spec.key
        assert length <= min(spec.context_length, smallest_verifier), spec.key
    assert (REGISTRY["qwen2.5-math-1.5b-instruct"].context_length,
            REGISTRY["llama-3.2-1b-instruct"].context_length,
            REGISTRY["smollm2-135m-instruct"].context_length) == (4096, 131072, 8192)


@pytest.mark.parametrize("option", GENERATORS)
def test_each_generator_yaml_sets_its_registry_limits(option):
    node = OmegaConf.load(CONF_DIR / "generator" / f"{option}.yaml")
    if node.model.startswith("tiny:"):  # a smoke-sized path within the real model's limits
        spec = find_spec(node.model.removeprefix("tiny:"))
        assert node.step_max_tokens <= spec.limits.step_max_tokens, option
        assert node.max_total_tokens <= spec.limits.max_total_tokens, option
        return
    spec = find_spec(node.model)
    assert spec is not None and spec.limits is not None, option
    assert (node.step_max_tokens, node.max_total_tokens) == (
        spec.limits.step_max_tokens, spec.limits.max_total_tokens)


# what a config may set in the verifier's node: its numerics (accuracy_power pins float32 on
# every host), never what names the model or decides its context
NUMERICS = {"dtype"}


def test_no_top_level_config_sets_the_verifiers_identity():
    """What lets the cross-product compose each verifier once: a config's verifier node is
    then the verifier group's file, whatever the config, up to its dtype (Hydra composes the
    groups into their own packages), and the context check reads only its model and backend."""
    for name in CONFIGS:
        node = OmegaConf.load(CONF_DIR / f"{name}.yaml")
        assert set(node.get("verifier") or {}) <= NUMERICS, name
    cfg = validate(compose("accuracy_power", []))
    assert (cfg.verifier.model, cfg.verifier.dtype) == ("qwen2.5-coder-1.5b-instruct", "float32")
    for group in ("generator", "verifier"):
        for path in (CONF_DIR / group).glob("*.yaml"):
            assert "@package" not in path.read_text(), path


@pytest.fixture(scope="module")
def verifiers():
    return {v: validate(compose("config", [f"verifier={v}"])).verifier for v in VERIFIERS}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_composes_with_every_generator_and_verifier(name, verifiers):
    """Each config with each registry generator (composed through `compose`, so the config's
    own generator fields apply and the schema and context checks run), then each registry
    verifier's context checked against that engine length; the fake generator pairs with
    the fake verifier only."""
    for generator in GENERATORS:
        cfg = validate(compose(name, [f"generator={generator}"]))
        for verifier, node in verifiers.items():
            try:
                check_context(dataclasses.replace(cfg, verifier=node))
            except ConfigError as err:
                pytest.fail(f"{name} generator={generator} verifier={verifier}: {err}")
    validate(compose(name, ["generator=fake", "verifier=fake"]))


def test_the_readme_gpu_command_fits_qwen_math_and_skywork():
    cfg = validate(compose("compare", ["generator=qwen2.5-math-1.5b", "verifier=skywork_1.5b", "memory=gpu"]))
    assert (cfg.generator.step_max_tokens, cfg.generator.max_total_tokens) == (256, 512)  # compare's path
    assert engine_length(cfg.generator) == 1024 + 512 + 512 <= 4096


def test_a_path_too_long_for_qwen_math_names_the_model_its_context_and_the_fix():
    with pytest.raises(ConfigError) as err:
        compose("compare", ["generator=qwen2.5-math-1.5b", "generator.max_total_tokens=4096"])
    assert str(err.value) == (
        "generator.model: Qwen/Qwen2.5-Math-1.5B-Instruct holds 4096 positions (registry entry "
        "'qwen2.5-math-1.5b-instruct'), but the engines are built for sequences of 5632 tokens: 1024 for the "
        "prompt + generator.max_total_tokens (4096) + 2 x generator.step_max_tokens (256); "
        "set generator.max_total_tokens=2560 (or lower)")


def test_a_verifier_with_a_shorter_context_than_the_generator_is_named():
    with pytest.raises(ConfigError) as err:
        compose("config", ["generator=llama3.2-1b", "generator.max_total_tokens=8192", "verifier=skywork_1.5b"])
    assert str(err.value).startswith("verifier.model: Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B holds 4096 positions")
    compose("config", ["generator=llama3.2-1b", "generator.max_total_tokens=8192", "verifier=rlhflow_8b"])


def test_a_step_too_long_for_the_path_says_what_to_set():
    with pytest.raises(ConfigError) as err:
        compose("compare", ["generator=qwen2.5-math-1.5b", "generator.step_max_tokens=1024"])
    assert "generator.max_total_tokens: 512 is below generator.step_max_tokens (1024)" in str(err.value)
    assert "set generator.max_total_tokens=1024 (or more) or generator.step_max_tokens=512 (or less)" in str(err.value)


def test_a_local_folder_is_checked_by_its_own_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 1536}))
    assert model_context(str(tmp_path)) == (1536, f"max_position_embeddings in {tmp_path / 'config.json'}")
    with pytest.raises(ConfigError) as err:  # 1024 + 768 + 2 x 96 > 1536
        compose("config", [f"generator.model={tmp_path}"])
    assert f"generator.model: {tmp_path} holds 1536 positions" in str(err.value)
    assert str(err.value).endswith("set generator.max_total_tokens=320 (or lower)")
    with pytest.raises(ConfigError) as err:  # no path fits a step of 256: both change
        compose("config", [f"generator.model={tmp_path}", "generator.step_max_tokens=256"])
    assert str(err.value).endswith("set generator.step_max_tokens=170 generator.max_total_tokens=172 (or lower)")
    assert model_context("nobody/unknown-model") is None  # not here, not in the registry: vLLM checks it


def test_the_ceiling_checks_its_own_length():
    with pytest.raises(ConfigError) as err:
        compose("ceiling", ["generator=qwen2.5-math-1.5b", "ceiling.new_tokens=4000"])
    assert "sequences of 5056 tokens: 1024 for the prompt + ceiling.new_tokens (4000)" in str(err.value)
