"""Roofline-guided KV allocation between the verifier and the generator (FlashTTS 4.3).

Minimise, over the verifier (prefill) batch ``B_pre`` and generator (decode) batch ``B_dec``::

    T_tot = ceil(N/B_pre) * T_pre(B_pre, S) + ceil(N/B_dec) * S_dec * T_dec(B_dec, S_dec/2)
    subject to  B_pre * KV_ver(S) + B_dec * KV_gen(S_dec) <= M

where each KV term uses that model's own shape. Batches above ``N`` are never useful:
``ceil(N/B)`` is already 1 at ``B = N`` and a larger batch only costs more per pass.

The paper puts ``B_dec`` on the memory boundary (eq. 1), arguing the stage time falls as
memory grows. With the ``ceil(N/B)`` factor that is not always true (N=10: B=5 runs two
full batches, B=6 runs two batches of six), so the search takes, for each ``B_pre``, the
best ``B_dec`` *up to* the eq. (1) boundary. A running minimum over ``B_dec`` makes that
O(N) and keeps the result equal to a brute-force search over all pairs. Ties go to the
larger ``B_dec`` (the paper's rule), then to the larger ``B_pre``: the roofline ignores
fixed per-forward costs, which favour larger batches whenever the model sees no difference.

Stage times are compared in integer nanoseconds. On compute-bound plateaus the modelled
times of different batch sizes are equal in exact arithmetic but differ by a few float
ulps; without rounding, that noise (not the tie rule) would pick the batch sizes, and
float sums could absorb differences, breaking the exactness of the O(N) decomposition.

Run ``python -m tts.benchmarks.allocator_timing`` to time the search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tts.memory.device import DeviceProfile
from tts.memory.roofline import FloatOrArray, IntOrArray, ModelShape, StageCost, decode_cost, prefill_cost

MODES = ("split", "offload")


@dataclass(frozen=True)
class Workload:
    """What the two models must process next: N requests of known lengths."""

    num_requests: int
    """N: requests to verify and to generate (e.g. live beams)."""
    verifier_seq_len: int
    """S: tokens per verifier request (prompt + steps scored)."""
    decode_len: int
    """S_dec: tokens each generator request decodes."""
    gen_context_len: int = 0
    """Tokens already in a generator request's KV before decoding (prompt, earlier
    steps). 0 reproduces the paper, which sizes generator KV by S_dec alone."""
    block_size: int = 1
    """KV is allocated in blocks of this many tokens (vLLM paging); 1 = no rounding."""
    context_blocks: float | None = None
    """Full KV blocks of context each request holds on its own account when requests share
    prefixes in a prefix cache (siblings their parent's path, every path its prompt): the
    distinct full context blocks of all N requests over N. A child's trailing partial block
    and what it decodes are its own. None: nothing shared; each request holds its whole
    context, as the paper sizes it."""

    def __post_init__(self) -> None:
        for name in ("num_requests", "verifier_seq_len", "decode_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"Workload.{name} must be >= 1, got {getattr(self, name)}")
        if self.gen_context_len < 0:
            raise ValueError(f"Workload.gen_context_len must be >= 0, got {self.gen_context_len}")
        if self.context_blocks is not None:
            if self.context_blocks < 0:
                raise ValueError(f"Workload.context_blocks must be >= 0, got {self.context_blocks}")
            if self.gen_context_len > self.verifier_seq_len:
                raise ValueError("Workload.gen_context_len must be <= verifier_seq_len when context is shared "
                                 f"(context_blocks), got {self.gen_context_len} > {self.verifier_seq_len}")

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size) * self.block_size

    def _held(self, own_tokens: int) -> float:
        """Tokens of KV one request holds: its context's full blocks (its share of them when
        shared) and, in blocks, the context's partial tail with its `own_tokens`."""
        full, tail = divmod(self.gen_context_len, self.block_size)
        shared = full if self.context_blocks is None else self.context_blocks
        return shared * self.block_size + self._blocks(tail + own_tokens)

    def kv_verifier(self, ver_shape: ModelShape) -> int:
        """KV bytes one verifier request holds: KVBytes(1, S); with shared context, its share
        of the context's blocks and the blocks of what follows the context."""
        if self.context_blocks is None:
            return ver_shape.kv_bytes_per_token * self._blocks(self.verifier_seq_len)
        return math.ceil(ver_shape.kv_bytes_per_token * self._held(self.verifier_seq_len - self.gen_context_len))

    def kv_generator(self, gen_shape: ModelShape) -> int:
        """KV bytes one generator request holds at the end of decoding: KVBytes(1, S_dec)
        over its context (its share of the context's blocks when shared)."""
        return math.ceil(gen_shape.kv_bytes_per_token * self._held(self.decode_len))

    @property
    def mean_decode_ctx(self) -> float:
        """Average cached context during decoding: S_cache ~ context + S_dec / 2."""
        return self.gen_context_len + self.decode_len / 2


@dataclass(frozen=True)
class Allocation:
    """The chosen batch sizes, their modelled times and the KV bytes they occupy."""

    b_pre: int
    b_dec: int
    t_total: float
    """Modelled seconds: t_verifier + t_generator, plus the offload overhead in ``offload``
    mode. All times are rounded to whole nanoseconds (see the module docstring)."""
    t_verifier: float
    """ceil(N/B_pre) * T_pre(B_pre, S)."""
    t_generator: float
    """ceil(N/B_dec) * S_dec * T_dec(B_dec, S_cache)."""
    kv_bytes_verifier: int
    kv_bytes_generator: int
    mode: str
    """``split``: both KV caches resident at once; ``offload``: the idle model is offloaded."""


def _to_ns(seconds: FloatOrArray) -> IntOrArray:
    """Round seconds to integer nanoseconds (half to even, same for scalars and arrays)."""
    if isinstance(seconds, np.ndarray):
        return np.rint(seconds * 1e9).astype(np.int64)
    return round(seconds * 1e9)


@dataclass(frozen=True)
class _Problem:
    """Per-request KV bytes and per-batch-size stage times (integer ns) for b = 1..N."""

    kv_ver: int
    kv_gen: int
    t_ver: np.ndarray
    t_gen: np.ndarray


def _stage_costs(gen_shape: ModelShape, ver_shape: ModelShape, workload: Workload) -> tuple[StageCost, StageCost]:
    return prefill_cost(ver_shape, workload.verifier_seq_len), decode_cost(gen_shape, workload.mean_decode_ctx)


def _t_verifier(pre: StageCost, device: DeviceProfile, n: int, b: IntOrArray) -> FloatOrArray:
    return (-(-n // b)) * pre.time(b, device)


def _t_generator(dec: StageCost, device: DeviceProfile, n: int, s_dec: int, b: IntOrArray) -> FloatOrArray:
    return ((-(-n // b)) * s_dec) * dec.time(b, device)


def _problem(gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile, workload: Workload) -> _Problem:
    pre, dec = _stage_costs(gen_shape, ver_shape, workload)
    n = workload.num_requests
    b = np.arange(1, n + 1, dtype=np.int64)
    return _Problem(
        kv_ver=workload.kv_verifier(ver_shape),
        kv_gen=workload.kv_generator(gen_shape),
        t_ver=_to_ns(_t_verifier(pre, device, n, b)),
        t_gen=_to_ns(_t_generator(dec, device, n, workload.decode_len, b)),
    )


def _prefix_argmin(t: np.ndarray) -> np.ndarray:
    """``out[m]`` = index of the minimum of ``t[:m+1]``, ties to the larger index."""
    # The last index holding the running minimum is the answer: any later drop of the
    # minimum would itself be such an index.
    is_best = t == np.minimum.accumulate(t)
    return np.maximum.accumulate(np.where(is_best, np.arange(t.size), 0))


def _pick(total: np.ndarray, b_pre: np.ndarray, b_dec: np.ndarray) -> int:
    """Index of the minimum ``total``; ties to larger ``b_dec``, then larger ``b_pre``."""
    tied = np.flatnonzero(total == total.min())
    tied = tied[b_dec[tied] == b_dec[tied].max()]
    return int(tied[np.argmax(b_pre[tied])])


def _build(b_pre: int, b_dec: int, t_ver_ns: int, t_gen_ns: int, kv_ver: int, kv_gen: int,
           mode: str, overhead_ns: int = 0) -> Allocation:
    return Allocation(b_pre, b_dec, (t_ver_ns + t_gen_ns + overhead_ns) / 1e9, t_ver_ns / 1e9,
                      t_gen_ns / 1e9, b_pre * kv_ver, b_dec * kv_gen, mode)


def _allocation(p: _Problem, b_pre: int, b_dec: int, mode: str, overhead_ns: int = 0) -> Allocation:
    return _build(b_pre, b_dec, int(p.t_ver[b_pre - 1]), int(p.t_gen[b_dec - 1]), p.kv_ver, p.kv_gen,
                  mode, overhead_ns)


def _search_split(p: _Problem, n: int, budget: int) -> Allocation | None:
    """Every feasible B_pre; for each, the best B_dec up to the eq. (1) boundary."""
    last_pre = min(n, (budget - p.kv_gen) // p.kv_ver)  # largest B_pre leaving room for B_dec = 1
    if last_pre < 1:
        return None
    b_pre = np.arange(1, last_pre + 1, dtype=np.int64)
    cap = np.minimum((budget - b_pre * p.kv_ver) // p.kv_gen, n)  # eq. (1), clipped to N
    b_dec = _prefix_argmin(p.t_gen)[cap - 1] + 1
    total = p.t_ver[:last_pre] + p.t_gen[b_dec - 1]
    i = _pick(total, b_pre, b_dec)
    return _allocation(p, int(b_pre[i]), int(b_dec[i]), "split")


def _search_apart(p: _Problem, n: int, gen_bytes: int, ver_bytes: int, mode: str,
                  overhead_ns: int = 0) -> Allocation | None:
    """Each model within its own bytes: the best batch of each, separately."""
    cap_pre, cap_dec = min(n, ver_bytes // p.kv_ver), min(n, gen_bytes // p.kv_gen)
    if cap_pre < 1 or cap_dec < 1:
        return None
    b_pre = int(_prefix_argmin(p.t_ver[:cap_pre])[-1]) + 1
    b_dec = int(_prefix_argmin(p.t_gen[:cap_dec])[-1]) + 1
    return _allocation(p, b_pre, b_dec, mode, overhead_ns)


def _search_offload(p: _Problem, n: int, budget: int, overhead_ns: int) -> Allocation | None:
    """Relaxed constraints: each model alone may use the whole budget, one at a time."""
    return _search_apart(p, n, budget, budget, "offload", overhead_ns)


def search_caps(gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile, workload: Workload,
                gen_kv_bytes: int, ver_kv_bytes: int) -> Allocation | None:
    """The (B_pre, B_dec) minimising modelled T_tot when each engine's KV is already fixed
    (vLLM sizes it when the engine starts): each batch within its own engine's bytes. What a
    run re-plans as its workload changes. None when one request does not fit an engine."""
    p = _problem(gen_shape, ver_shape, device, workload)
    return _search_apart(p, workload.num_requests, int(gen_kv_bytes), int(ver_kv_bytes), "split")


def _cheaper(split: Allocation | None, offload: Allocation | None) -> Allocation | None:
    """The lower ``t_total``; split wins ties (no transfer risk)."""
    if split is None or (offload is not None and offload.t_total < split.t_total):
        return offload
    return split


def search_allocation(gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile,
                      workload: Workload, kv_budget_bytes: int,
                      offload_overhead_s: float | None = None) -> Allocation | None:
    """The (B_pre, B_dec) minimising modelled T_tot within ``kv_budget_bytes`` of KV.

    O(N) in the number of requests. Returns ``None`` when not even one request of each
    model fits. With ``offload_overhead_s`` (seconds to swap the idle model out and back,
    e.g. vLLM sleep mode), the relaxed offload option is evaluated too and the cheaper
    of the two is returned, with ``mode`` telling which.
    """
    p = _problem(gen_shape, ver_shape, device, workload)
    n, budget = workload.num_requests, int(kv_budget_bytes)
    split = _search_split(p, n, budget)
    if offload_overhead_s is None:
        return split
    return _cheaper(split, _search_offload(p, n, budget, _to_ns(offload_overhead_s)))


def evaluate_allocation(gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile,
                        workload: Workload, b_pre: int, b_dec: int) -> Allocation:
    """Modelled times and KV bytes of one given (B_pre, B_dec), without searching.

    For comparing a fixed split (e.g. a static fraction's batch caps) with the search.
    Batches are clipped to N, as in the search.
    """
    if b_pre < 1 or b_dec < 1:
        raise ValueError(f"b_pre and b_dec must be >= 1, got {b_pre}, {b_dec}")
    n = workload.num_requests
    b_pre, b_dec = min(b_pre, n), min(b_dec, n)
    pre, dec = _stage_costs(gen_shape, ver_shape, workload)
    return _build(b_pre, b_dec, _to_ns(_t_verifier(pre, device, n, b_pre)),
                  _to_ns(_t_generator(dec, device, n, workload.decode_len, b_dec)),
                  workload.kv_verifier(ver_shape), workload.kv_generator(gen_shape), "split")


def _brute_best(t_ver: list[int], t_gen: list[int], pairs: list[tuple[int, int]]) -> tuple[int, int] | None:
    best: tuple[float, int, int] | None = None
    for bp, bd in pairs:
        key = (t_ver[bp - 1] + t_gen[bd - 1], -bd, -bp)
        if best is None or key < best:
            best = key
    return None if best is None else (-best[2], -best[1])


def brute_force_allocation(gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile,
                           workload: Workload, kv_budget_bytes: int,
                           offload_overhead_s: float | None = None) -> Allocation | None:
    """Reference for tests: every (B_pre, B_dec) pair in 1..N, scalar arithmetic, O(N^2)."""
    pre, dec = _stage_costs(gen_shape, ver_shape, workload)
    n, s_dec, budget = workload.num_requests, workload.decode_len, int(kv_budget_bytes)
    kv_ver, kv_gen = workload.kv_verifier(ver_shape), workload.kv_generator(gen_shape)
    t_ver = [_to_ns(_t_verifier(pre, device, n, b)) for b in range(1, n + 1)]
    t_gen = [_to_ns(_t_generator(dec, device, n, s_dec, b)) for b in range(1, n + 1)]
    p = _Problem(kv_ver, kv_gen, np.array(t_ver), np.array(t_gen))
    grid = [(bp, bd) for bp in range(1, n + 1) for bd in range(1, n + 1)]
    split_pair = _brute_best(t_ver, t_gen, [(bp, bd) for bp, bd in grid if bp * kv_ver + bd * kv_gen <= budget])
    split = None if split_pair is None else _allocation(p, *split_pair, "split")
    if offload_overhead_s is None:
        return split
    relaxed = [(bp, bd) for bp, bd in grid if bp * kv_ver <= budget and bd * kv_gen <= budget]
    off_pair = _brute_best(t_ver, t_gen, relaxed)
    offload = None if off_pair is None else _allocation(p, *off_pair, "offload", _to_ns(offload_overhead_s))
    return _cheaper(split, offload)

