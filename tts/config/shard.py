"""`bench.shard`: "I/K", shard I of K of a run's selected problems (`tts.problems.shard_of`)."""

from __future__ import annotations


def parse_shard(shard: str) -> tuple[int, int]:
    """`bench.shard` "I/K" as (I, K), 0 <= I < K; a ValueError names the field otherwise."""
    index, _, count = str(shard).partition("/")
    if not (index.isdigit() and count.isdigit()) or int(count) < 1:
        raise ValueError(f"bench.shard: {shard!r} is not I/K (shard I of K, 0 <= I < K, e.g. 0/4)")
    if int(index) >= int(count):
        raise ValueError(f"bench.shard: {shard!r}: I must be below K (the shards of {count} are "
                         f"0/{count} to {int(count) - 1}/{count})")
    return int(index), int(count)
