"""KV-split policies: how the engine divides one KV budget between the two vLLM engines.

The engine calls :meth:`AllocationPolicy.split` whenever the workload changes (beam
count, lengths) and applies the result as each engine's KV bytes and ``max_num_seqs``.
Policies are chosen by name with :func:`make_allocation_policy`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from tts.memory.allocator import Allocation, Workload, search_allocation
from tts.memory.device import DeviceProfile
from tts.memory.roofline import ModelShape


@dataclass(frozen=True)
class KVSplit:
    """KV bytes and batch caps for the generator and verifier engines."""

    generator_kv_bytes: int
    verifier_kv_bytes: int
    generator_max_seqs: int
    """``max_num_seqs`` for the generator engine (B_dec)."""
    verifier_max_seqs: int
    """``max_num_seqs`` for the verifier engine (B_pre)."""
    offload: bool = False
    """True: each engine gets the whole budget and the idle one must be offloaded
    (slept) while the other runs; False: both caches are resident together."""
    allocation: Allocation | None = None
    """The roofline search result behind this split, when there is one."""


class AllocationPolicy(ABC):
    """Divides a KV budget between generator and verifier for a workload.

    Contract: the returned split never exceeds ``kv_budget_bytes`` in total (per engine
    when ``offload`` is set), each cap is in ``1..workload.num_requests`` and fits that
    engine's KV bytes; ``None`` means not even one request of each model fits.
    """

    name: ClassVar[str]

    def __init__(self, gen_shape: ModelShape, ver_shape: ModelShape) -> None:
        self.gen_shape = gen_shape
        self.ver_shape = ver_shape

    @abstractmethod
    def split(self, kv_budget_bytes: int, workload: Workload) -> KVSplit | None:
        """The KV split for ``workload`` within ``kv_budget_bytes``, or ``None`` on shortage."""


class StaticSplit(AllocationPolicy):
    """A fixed fraction of the budget for the generator, the rest for the verifier."""

    name = "static"

    def __init__(self, gen_shape: ModelShape, ver_shape: ModelShape, fraction: float = 0.5,
                 device: DeviceProfile | None = None) -> None:
        """``fraction``: generator share in (0, 1). ``device`` is accepted and unused."""
        super().__init__(gen_shape, ver_shape)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"StaticSplit.fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction

    def split(self, kv_budget_bytes: int, workload: Workload) -> KVSplit | None:
        """Split by ``fraction``; caps are how many requests fit each share, at most N."""
        gen_bytes = int(kv_budget_bytes * self.fraction)
        ver_bytes = int(kv_budget_bytes) - gen_bytes
        n = workload.num_requests
        gen_cap = min(n, gen_bytes // workload.kv_generator(self.gen_shape))
        ver_cap = min(n, ver_bytes // workload.kv_verifier(self.ver_shape))
        if gen_cap < 1 or ver_cap < 1:
            return None
        return KVSplit(gen_bytes, ver_bytes, gen_cap, ver_cap)


class RooflineSplit(AllocationPolicy):
    """FlashTTS roofline-guided split (:func:`search_allocation`), optionally with offload."""

    name = "roofline"

    def __init__(self, gen_shape: ModelShape, ver_shape: ModelShape, device: DeviceProfile | None = None,
                 offload_overhead_s: float | None = None) -> None:
        """``offload_overhead_s``: cost of swapping the idle model out and in; None disables offload."""
        super().__init__(gen_shape, ver_shape)
        if device is None:
            raise ValueError("RooflineSplit needs a device profile (device=...)")
        if offload_overhead_s is not None and offload_overhead_s < 0:
            raise ValueError(f"offload_overhead_s must be >= 0, got {offload_overhead_s}")
        self.device = device
        self.offload_overhead_s = offload_overhead_s

    def split(self, kv_budget_bytes: int, workload: Workload) -> KVSplit | None:
        """Verifier gets B_pre requests' worth of KV; the generator gets the rest (decode is
        the memory-hungry stage, and spare blocks serve its prefix cache)."""
        budget = int(kv_budget_bytes)
        alloc = search_allocation(self.gen_shape, self.ver_shape, self.device, workload, budget,
                                  self.offload_overhead_s)
        if alloc is None:
            return None
        if alloc.mode == "offload":
            return KVSplit(budget, budget, alloc.b_dec, alloc.b_pre, offload=True, allocation=alloc)
        ver_bytes = alloc.kv_bytes_verifier
        return KVSplit(budget - ver_bytes, ver_bytes, alloc.b_dec, alloc.b_pre, allocation=alloc)


ALLOCATION_POLICIES: dict[str, type[AllocationPolicy]] = {
    cls.name: cls for cls in (StaticSplit, RooflineSplit)
}


def make_allocation_policy(name: str, **kwargs: Any) -> AllocationPolicy:
    """Build the policy registered as ``name`` (``static`` or ``roofline``) with ``kwargs``.

    All policies take ``gen_shape`` and ``ver_shape``; ``static`` takes ``fraction``,
    ``roofline`` takes ``device`` and ``offload_overhead_s``.
    """
    if name not in ALLOCATION_POLICIES:
        raise ValueError(f"unknown allocation policy {name!r}; valid: {sorted(ALLOCATION_POLICIES)}")
    return ALLOCATION_POLICIES[name](**kwargs)
