"""The simulated vLLM engine a replay backend runs its requests on (`tts.replay.backends`).

A `SimEngine` is one vLLM engine as far as the clock goes: running sequences decode one
token per step, new ones are admitted while the batch cap, the step's token budget and the
KV cache allow, their prompts prefilled less what the prefix cache holds (full blocks,
LRU); a finished or aborted sequence leaves its blocks cached, as vLLM does. When the running
sequences' next tokens need more blocks than the pool has, the one admitted last is preempted
(vLLM V1's rule for first-come-first-served scheduling): its blocks go back to the pool, still
cached until evicted, and it waits at the head of the queue to be prefilled again, its
prompt and the tokens it had generated, less what the cache still holds of them. Thrash,
evictions and preemptions are counted in the prefix cache (`PrefixCache.counts`), as a vLLM
run counts them in its block pool. Not modelled: chunked prefill's interplay with
preemption beyond the step's token budget, vLLM's null block and the KV a sliding window
adds, and anything a step costs that the cost model does not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tts.backends.base import StepStats
from tts.backends.prefix_cache import PrefixCache, block_keys
from tts.metrics.step_cost import StepCost


@dataclass(eq=False)
class Slot:
    """One sequence in a simulated engine."""

    ids: list[int]
    todo: int = 0  # prompt tokens still to compute
    cached: int = 0  # prompt tokens the prefix cache served
    keys: list[int] = field(default_factory=list)  # its full blocks' hashes while it runs


class SimEngine:
    """A vLLM engine's scheduling, as far as the clock goes (module docstring)."""

    def __init__(self, cost: StepCost, cache: PrefixCache, batch_cap: int, token_cap: int, kv_blocks: int) -> None:
        self.cost = cost
        self.cache = cache
        self.batch_cap = batch_cap
        self.token_cap = token_cap
        self.kv_blocks = kv_blocks
        self.waiting: list[Slot] = []
        self.running: list[Slot] = []

    def _hold(self, slot: Slot) -> None:
        """The slot's full blocks (as far as its tokens go) are held while it runs."""
        new = list(block_keys(slot.ids, self.cache.block, len(slot.keys), slot.keys[-1] if slot.keys else 0))
        slot.keys += new
        self.cache.held.update(new)

    def _unhold(self, slot: Slot) -> None:
        self.cache.held.subtract(slot.keys)
        for key in slot.keys:
            if self.cache.held[key] <= 0:
                del self.cache.held[key]
        slot.keys = []

    def in_use(self) -> int:
        """Blocks the running sequences hold: a full block once however many share it (a
        common prefix), and each sequence's block for its next token."""
        for s in self.running:
            self._hold(s)
        return len(self.cache.held) + len(self.running)

    def _need(self, slot: Slot) -> int:
        """The blocks a waiting sequence would add: its full blocks nobody holds, and one
        for its next token."""
        held = self.cache.held
        return sum(1 for key in block_keys(slot.ids, self.cache.block) if key not in held) + 1

    def step(self, late: Sequence[int] = ()) -> tuple[list[Slot], float, tuple[int, ...]]:
        """Schedule and cost one step: the sequences that sample a token in it (decoders,
        and those whose prefill completes), its seconds, its tokens per sequence. `late`:
        the context lengths of sequences stopped since the step before that decode once more
        in this one, their tokens thrown away (overlap's late tokens: priced, never sampled)."""
        self._preempt()
        budget = self.token_cap - len(late)
        decode = [s for s in self.running if not s.todo][:budget]
        budget -= len(decode)
        chunks = []
        for s in self.running:
            if s.todo and budget > 0:
                chunks.append((s, min(s.todo, budget)))
                budget -= chunks[-1][1]
        in_use = self.in_use()
        while self.waiting and len(self.running) < self.batch_cap and budget > 0:
            s = self.waiting[0]
            need = self._need(s)
            if self.running and in_use + need > self.kv_blocks:
                break  # waits for KV blocks, as vLLM's scheduler makes it
            self.waiting.pop(0)
            self.running.append(s)
            self._hold(s)
            in_use += need
            # vLLM computes at least a prompt's last token: a hit stops at the last full block before it
            s.cached = min(self.cache.admit(s.ids, reserve=in_use), (len(s.ids) - 1) // self.cache.block * self.cache.block)
            s.todo = len(s.ids) - s.cached
            chunks.append((s, min(s.todo, budget)))
            budget -= chunks[-1][1]
        seconds = self.cost.step_s([len(s.ids) for s in decode] + list(late),
                                   [(n, len(s.ids) - s.todo) for s, n in chunks])
        for s, n in chunks:
            s.todo -= n
        sampled = decode + [s for s, _ in chunks if not s.todo]
        return sampled, seconds, (1,) * (len(decode) + len(late)) + tuple(n for _, n in chunks)

    def _preempt(self) -> None:
        """While the running sequences' next tokens need more blocks than the pool has, the
        last admitted is preempted (module docstring)."""
        while len(self.running) > 1 and self.in_use() > self.kv_blocks:
            victim = self.running.pop()
            self._unhold(victim)
            self.cache.admit(victim.ids, reserve=self.in_use(), count=False)  # cached, evictable
            victim.todo = victim.cached = 0
            self.waiting.insert(0, victim)
            self.cache.note("preemptions")

    def release(self, slot: Slot) -> None:
        """A sequence leaves (finished or aborted); its full blocks stay cached."""
        if slot in self.running:
            self.running.remove(slot)
            self._unhold(slot)
            self.cache.admit(slot.ids, reserve=self.in_use(), count=False)
        elif slot in self.waiting:
            self.waiting.remove(slot)

    def stats(self, tokens: tuple[int, ...], seconds: float) -> StepStats:
        return StepStats(len(tokens), len(self.waiting), sum(tokens), self.batch_cap, self.token_cap,
                         min(1.0, self.in_use() / self.kv_blocks) if self.kv_blocks else 0.0, seconds, tokens)
