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
run counts them in its block pool.

Blocks are counted as vLLM's block pool holds them. A sequence shares a block with others
only where it found it in the prefix cache when admitted; every block it computes is its
own, cached as soon as it is full (a sequence admitted later finds it). A block whose tokens
were already cached or held when it was computed (two sequences that decode the same tokens,
or a block-aligned prompt whose last block vLLM computes again) is a second copy, held
beside the first and cached as a block of its own once its sequence leaves: vLLM never
merges blocks, and evicts (and counts) each copy on its own. A sequence holds as many
blocks as its tokens fill, the one it computes next included, and the pool keeps one block
back (vLLM's null block, `of_pool`). On a beam search's rounds through real vLLM on a pool
too small for them, this engine preempts as often as vLLM's scheduler did
(tests/test_replay_vllm.py). Not modelled: chunked prefill's interplay with preemption
beyond the step's token budget (a sequence holds all its prompt's blocks from its first
chunk), the KV a sliding window adds, which copy a lookup finds where several are cached
(a held one where there is one, here), the order in which copies of one hash are evicted
(together, here), and anything a step costs that the cost model does not see.
"""

from __future__ import annotations

from collections import Counter
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
    copies: set[int] = field(default_factory=set)  # those it holds as a second copy (module docstring)


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
        self._first: Counter[int] = Counter()  # the running sequences holding each block's first copy
        self._copies = 0  # second copies held

    @classmethod
    def of_pool(cls, cost: StepCost, block: int, num_blocks: int, batch_cap: int, token_cap: int) -> SimEngine:
        """The engine of a vLLM block pool of `num_blocks` blocks of `block` tokens, one of
        them vLLM's null block, which no sequence is given."""
        usable = max(1, num_blocks - 1)
        return cls(cost, PrefixCache(block, usable), batch_cap, token_cap, usable)

    def _hit(self, slot: Slot, keys: list[int]) -> int:
        """The leading blocks of a waiting sequence (its full blocks' `keys`) the prefix
        cache holds, short of its last token (vLLM computes at least that one)."""
        cap = (len(slot.ids) - 1) // self.cache.block
        hit = 0
        for key in keys:
            if hit == cap or key not in self.cache:
                break
            hit += 1
        return hit

    def _hold(self, slot: Slot, shared: int = 0) -> list[int]:
        """The slot's full blocks, as far as its tokens go, held while it runs: the first
        `shared` found in the prefix cache (shared with their other holders), the others
        computed by it and cached as blocks of their own (module docstring). Returns the
        blocks it holds from now on."""
        cache, first, held = self.cache, self._first, self.cache.held
        new = list(block_keys(slot.ids, cache.block, len(slot.keys), slot.keys[-1] if slot.keys else 0))
        computed = []
        for i, key in enumerate(new, len(slot.keys)):
            if i >= shared:
                computed.append(key)
                if key in first or key in cache:
                    slot.copies.add(key)
                    self._copies += 1
                    held[key] += 1
                    continue
            if key not in first:  # the block's first holder
                held[key] += 1
            first[key] += 1
        cache.insert(computed, copy=True)
        slot.keys += new
        return new

    def _unhold(self, slot: Slot) -> None:
        """The slot gives its blocks back, cached (the blocks its last tokens filled too),
        its last block first in line to be evicted."""
        self._hold(slot)
        first, held = self._first, self.cache.held
        for key in slot.keys:
            if key in slot.copies:
                self._copies -= 1
            else:
                first[key] -= 1
                if first[key] > 0:
                    continue
                del first[key]
            held[key] -= 1
            if held[key] <= 0:
                del held[key]
        self.cache.touch(slot.keys)
        slot.keys, slot.copies = [], set()

    def in_use(self) -> int:
        """Blocks the running sequences hold: a shared block once however many share it,
        a second copy once more (module docstring), and each sequence's last block, not
        full (the token it computes next is its last). A block a decoding sequence fills is
        cached from then on."""
        for s in self.running:
            self._hold(s)
        return len(self._first) + self._copies + sum(1 for s in self.running if len(s.ids) % self.cache.block)

    def _need(self, slot: Slot, keys: list[int], hit: int) -> int:
        """The blocks a waiting sequence (its full blocks' `keys`) would add: the `hit`
        blocks it finds in the cache that nobody holds, and every block it computes, its
        last one not full included."""
        return (sum(1 for key in keys[:hit] if key not in self._first) + len(keys) - hit
                + (len(slot.ids) % self.cache.block > 0))

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
        self.cache.evict(reserve=in_use)  # the blocks the decoders filled came from the free pool
        while self.waiting and len(self.running) < self.batch_cap and budget > 0:
            s = self.waiting[0]
            keys = list(block_keys(s.ids, self.cache.block))  # hashed once for both
            hit = self._hit(s, keys)
            need = self._need(s, keys, hit)
            if self.running and in_use + need > self.kv_blocks:
                break  # waits for KV blocks, as vLLM's scheduler makes it
            self.waiting.pop(0)
            self.running.append(s)
            self.cache.count_lookup(keys, hit)
            self.cache.touch(keys[:hit])
            self._hold(s, shared=hit)
            in_use += need
            self.cache.evict(reserve=in_use)
            s.cached = hit * self.cache.block
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
            self._unhold(victim)  # its blocks stay cached, evictable
            self.cache.evict(reserve=self.in_use())
            victim.todo = victim.cached = 0
            self.waiting.insert(0, victim)
            self.cache.note("preemptions")

    def release(self, slot: Slot) -> None:
        """A sequence leaves (finished or aborted); its full blocks stay cached."""
        if slot in self.running:
            self.running.remove(slot)
            self._unhold(slot)
            self.cache.evict(reserve=self.in_use())
        elif slot in self.waiting:
            self.waiting.remove(slot)

    def held_after_step(self) -> int:
        """Blocks in use as vLLM's block pool reports them after a step (`kv_cache_manager.usage`):
        those of the tokens computed. A decoding sequence's last token was sampled, not yet
        computed; where it is alone in a block, vLLM gives that block in the next step's
        schedule, which `in_use` already counts (it is the next step's need)."""
        alone = sum(1 for s in self.running if not s.todo and len(s.ids) % self.cache.block == 1)
        return self.in_use() - alone

    def stats(self, tokens: tuple[int, ...], seconds: float) -> StepStats:
        """The step's statistics; the KV usage vLLM's scheduler reports after it (`held_after_step`),
        which speculation's memory rule reads (`tts.engine.speculation.memory`)."""
        usage = min(1.0, self.held_after_step() / self.kv_blocks) if self.kv_blocks else 0.0
        return StepStats(len(tokens), len(self.waiting), sum(tokens), self.batch_cap, self.token_cap,
                         usage, seconds, tokens)
