"""The rolling hash of a token sequence: a prompt's key in a run's trace (`tts.trace.format`).

A polynomial hash, so that the key of a sequence extended by more tokens is computed from
the shorter one's key alone: a beam keeps its path's key as its steps are appended
(`tts.search.tree.Beam.path_key`) and a request carries its prompt's
(`tts.backends.base.GenRequest.prompt_key`), so a trace at n=512 does not hash every
prompt from its first token at every step; and a replay finds the rest of a step it
resumes in the request that first sampled it.
"""

from __future__ import annotations

from collections.abc import Sequence

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def extend_hash(h: int, token_ids: Sequence[int]) -> int:
    """The rolling hash of a prompt extended by `token_ids` (0 is the empty prompt's)."""
    for t in token_ids:
        h = (h * _BASE + t + 1) % _MOD
    return h
