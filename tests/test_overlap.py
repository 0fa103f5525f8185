"""Overlap (`generator.overlap`, vLLM's asynchronous scheduling) without a GPU: the fake
backend's one-step lag behaves as `EngineCore.step_with_batch_queue` does (outputs one step
behind, an empty first step, a stopped request's token in flight thrown away and counted
late), the engine grows the same trees under it, and the options resolve as documented."""

import pytest

from tts.backends.base import FinishReason, GenRequest
from tts.backends.fake import EOS_CHAR, FakeGenerator, encode, prompt_text


def stepped(gen: FakeGenerator, steps: int, abort_after: dict[int, list[str]] | None = None):
    """`steps` steps of `gen`: each step's (request id, text, finish) and its stats, with the
    aborts of `abort_after[k]` after step k and their late tokens."""
    out, late = [], {}
    for k in range(steps):
        deltas, stats = gen.step()
        out.append(([(d.request_id, gen.decode(d.new_token_ids), d.finish_reason) for d in deltas], stats))
        if k in (abort_after or {}):
            late[k] = gen.abort(abort_after[k])
    return out, late


def two_requests(lag: bool) -> FakeGenerator:
    """Request "e" writes "ab" and EOS; "n" runs to its max_tokens of 3 ("abc")."""
    gen = FakeGenerator(lambda problem, steps, seed: "abc" if seed else "ab" + EOS_CHAR, lag=lag)
    prompt = tuple(gen.encode_prompt("p", "s"))
    gen.add(GenRequest("e", prompt, max_tokens=10, seed=0))
    gen.add(GenRequest("n", prompt, max_tokens=3, seed=1))
    return gen


def test_the_lag_returns_each_step_one_step_late_and_an_eos_costs_one_late_token():
    """Without the lag, step k returns batch k; with it, step k returns batch k-1 (the first
    none), the same tokens in the same order. A request ending at EOS is scheduled once more
    before its EOS comes back (a late token, in the step that returns the EOS); one ending at
    its max_tokens is not (vLLM's scheduler knows the count ahead)."""
    sync, _ = stepped(two_requests(False), 4)
    lagged, _ = stepped(two_requests(True), 5)
    assert [d for d, _ in lagged] == [[]] + [d for d, _ in sync]
    assert [d for d, _ in sync][2] == [("e", EOS_CHAR, FinishReason.EOS), ("n", "c", FinishReason.LENGTH)]
    assert [s.late_tokens for _, s in sync] == [0, 0, 0, 0]
    assert [s.late_tokens for _, s in lagged] == [0, 0, 0, 1, 0]  # the EOS's extra row, nothing for the length stop
    assert [s.num_running for _, s in lagged] == [2, 2, 2, 1, 0]
    gen = two_requests(True)
    stepped(gen, 4)
    assert gen.num_unfinished() == 0


def test_an_abort_drops_the_token_in_flight_and_counts_it_late():
    """Aborted after the step that returned its first token, a request's second token is
    already computed: it is dropped (never returned) and the abort says one late token; a
    request aborted before it was ever scheduled costs none."""
    _, late = stepped(two_requests(False), 3, {1: ["e"]})
    assert late == {1: 0}
    gen = two_requests(True)
    out, late = stepped(gen, 4, {1: ["e"]})
    assert late == {1: 1}
    assert [rid for deltas, _ in out for rid, *_ in deltas].count("e") == 1  # its first token only
    gen.add(GenRequest("w", tuple(encode(prompt_text("p", "s"))), max_tokens=3, seed=1))
    assert gen.abort(["w"]) == 0
