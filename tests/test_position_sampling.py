"""Position-keyed sampling arithmetic (`tts.backends.position_sampling`), without vLLM:
the uniform depends on (seed, position) only, and inverse-CDF sampling draws from
softmax(logits / T) restricted to the top-p nucleus."""

import math

import pytest
import torch

from tts.backends.position_sampling import position_uniform, sample_rows


def test_uniform_is_a_function_of_seed_and_position() -> None:
    draws = [position_uniform(seed, pos) for seed in range(50) for pos in range(200)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert draws == [position_uniform(seed, pos) for seed in range(50) for pos in range(200)]
    assert len(set(draws)) == len(draws)  # no two (seed, position) pairs collide here
    assert abs(sum(draws) / len(draws) - 0.5) < 0.01
    tenths = [sum(1 for u in draws if k / 10 <= u < (k + 1) / 10) for k in range(10)]
    chi2 = sum((c - len(draws) / 10) ** 2 / (len(draws) / 10) for c in tenths)
    assert chi2 < 27.9  # uniform: chi-square with 9 degrees of freedom, p = 0.001
    # neighbouring positions of one seed are not correlated
    xs = [position_uniform(7, p) for p in range(5000)]
    mean = sum(xs) / len(xs)
    cov = sum((a - mean) * (b - mean) for a, b in zip(xs, xs[1:])) / (len(xs) - 1)
    assert abs(cov / (1 / 12)) < 0.05


def stratified(n: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


@pytest.mark.parametrize("temperature", [0.5, 0.8, 1.0, 2.0])
def test_inverse_cdf_draws_the_softmax_distribution(temperature: float) -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, float("-inf"), 0.0])
    n = 20000
    tokens = sample_rows(logits.expand(n, -1), torch.full((n,), temperature), torch.ones(n), stratified(n))
    freq = torch.bincount(tokens, minlength=len(logits)).double() / n
    expected = torch.softmax(logits.double() / temperature, dim=-1)
    assert torch.allclose(freq, expected, atol=2 / n)
    assert freq[4] == 0  # a masked token is never drawn


def test_top_p_keeps_the_nucleus_and_renormalises() -> None:
    logits = torch.log(torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05]))
    n = 10000
    tokens = sample_rows(logits.expand(n, -1), torch.ones(n), torch.full((n,), 0.7), stratified(n))
    freq = torch.bincount(tokens, minlength=5).double() / n
    # 0.5 then 0.3 reach 0.7: the nucleus is {1, 3}, renormalised to 5/8 and 3/8
    assert torch.allclose(freq, torch.tensor([0, 5 / 8, 0, 3 / 8, 0], dtype=torch.float64), atol=2 / n)


def test_rows_sample_independently_with_their_own_parameters() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    u = torch.tensor([0.999, 0.5, 0.34], dtype=torch.float64)
    got = sample_rows(logits, torch.tensor([1.0, 0.01, 1.0]), torch.tensor([1.0, 1.0, 1.0]), u)
    assert got.tolist() == [2, 0, 1]  # top of the CDF; near-greedy; a third of the way along
    one = sample_rows(logits[:1], torch.tensor([1.0]), torch.tensor([1.0]), u[:1])
    assert one.tolist() == got[:1].tolist()  # a row's draw does not depend on the batch


def test_a_uniform_at_the_top_never_runs_off_the_vocabulary() -> None:
    logits = torch.tensor([[0.0, 0.0, -math.inf]])
    got = sample_rows(logits, torch.ones(1), torch.ones(1), torch.tensor([1.0 - 2 ** -53], dtype=torch.float64))
    assert got.tolist() == [1]


def test_vectorised_uniforms_are_the_scalar_function() -> None:
    import numpy as np

    from tts.backends.position_sampling import position_uniforms

    seeds = [0, 1, 5, 2**31 - 1, 2**40 + 3, 2**64 - 1]
    positions = [0, 1, 17, 4096, 2**20, 123456]
    got = position_uniforms(np.array(seeds, dtype=np.uint64), np.array(positions, dtype=np.int64))
    assert got.tolist() == [position_uniform(s, p) for s, p in zip(seeds, positions)]


def test_a_large_vocabulary_is_searched_block_by_block_exactly() -> None:
    """Vocabularies of several blocks, one not a multiple of the block: the draws follow the
    softmax, land only on tokens of positive probability, and a row's token is the same
    alone as in a batch."""
    torch.manual_seed(0)
    vocab = 1000  # 4 blocks of 256, the last one short
    logits = torch.randn(vocab) * 2
    logits[::7] = float("-inf")  # masked tokens, some at block edges
    n = 20000
    tokens = sample_rows(logits.expand(n, -1).clone(), torch.full((n,), 0.9), torch.ones(n), stratified(n))
    freq = torch.bincount(tokens, minlength=vocab).double() / n
    expected = torch.softmax(logits.double() / 0.9, dim=-1)
    assert (freq[::7] == 0).all()
    assert (freq - expected).abs().max() < 2e-3
    batch = torch.randn(9, vocab)
    u = torch.rand(9, dtype=torch.float64)
    together = sample_rows(batch.clone(), torch.full((9,), 0.7), torch.full((9,), 0.95), u)
    alone = [sample_rows(batch[i:i + 1].clone(), torch.tensor([0.7]), torch.tensor([0.95]), u[i:i + 1]).item()
             for i in range(9)]
    assert together.tolist() == alone
    # a row without top-p draws the same token whether or not another row uses top-p
    mixed = sample_rows(batch.clone(), torch.full((9,), 0.7), torch.tensor([1.0] * 8 + [0.5]), u)
    plain = sample_rows(batch.clone(), torch.full((9,), 0.7), torch.ones(9), u)
    assert mixed[:8].tolist() == plain[:8].tolist()


def test_sampling_in_place_gives_the_same_tokens() -> None:
    logits = torch.randn(5, 700)
    u = torch.rand(5, dtype=torch.float64)
    args = (torch.full((5,), 0.8), torch.ones(5), u)
    copy = sample_rows(logits, *args)
    assert torch.equal(sample_rows(logits.clone(), *args, nucleus_rows=torch.empty(0, dtype=torch.long),
                                   inplace=True), copy)


def test_the_vllm_processor_samples_its_rows_and_leaves_the_others() -> None:
    """PositionSampler without an engine: rows that asked for position sampling get the
    token `sample_rows` draws at their (seed, position), as the row's maximum (vLLM sees
    them as greedy); a plain row is left alone; a step with fewer logit rows samples those."""
    pytest.importorskip("vllm")
    import numpy as np
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from tts.backends.position_sampling import position_uniforms
    from tts.backends.vllm.sampling import PositionSampler, position_params

    proc = PositionSampler(None, torch.device("cpu"), False)
    outs = [[5, 6], [], [1]]
    params = [position_params(max_tokens=4, seed=3, temperature=0.7),
              SamplingParams(max_tokens=4, seed=9, temperature=0.7),
              position_params(max_tokens=4, seed=8, temperature=1.3, top_p=0.9)]
    assert params[0].temperature == 0.0 and params[2].temperature == 0.0  # greedy for vLLM
    proc.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                  added=[(i, p, [0] * 10, o) for i, (p, o) in enumerate(zip(params, outs))]))
    logits = torch.randn(3, 600)
    before = logits.clone()
    proc.apply(logits)
    u = position_uniforms(np.array([3, 8], dtype=np.uint64), np.array([12, 11]))
    want = sample_rows(before[[0, 2]], torch.tensor([0.7, 1.3]), torch.tensor([1.0, 0.9]), torch.from_numpy(u))
    assert logits[[0, 2]].argmax(dim=-1).tolist() == want.tolist()
    assert torch.equal(logits[1], before[1])
    outs[0].append(7)  # the row grew by a token: its next draw is at the next position
    short = torch.randn(2, 600)  # row 2 has no logits this step
    first = short[0].clone()
    proc.apply(short)
    u0 = position_uniforms(np.array([3], dtype=np.uint64), np.array([13]))
    assert short[0].argmax().item() == sample_rows(first[None], torch.tensor([0.7]), torch.ones(1),
                                                   torch.from_numpy(u0)).item()


def test_the_vllm_processor_draws_the_same_tokens_under_asynchronous_scheduling() -> None:
    """With `generator.overlap` (vLLM's asynchronous scheduling) a row's token is known on
    the host a step late. vLLM 0.32's V1 runner then appends a -1 placeholder to the row's
    output list as it samples (`_bookkeeping_sync`), and writes the real token over it
    before the next step's logits processors run (`update_async_output_token_ids`, done
    because a custom processor reads the lists): the sampler reads only the list's length,
    which the placeholder keeps current, so every draw is at the position the synchronous
    run draws at, and the tokens are the same (placeholders left unreplaced, too). A list
    that lagged one token in length would draw at the previous position: other tokens."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.logits_processor import BatchUpdate

    from tts.backends.vllm.sampling import PositionSampler, position_params

    params = [position_params(max_tokens=32, seed=s, temperature=1.0) for s in (3, 11)]
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(2, 50, generator=gen) for _ in range(12)]

    def run(bookkeep) -> list[list[int]]:
        proc = PositionSampler(None, torch.device("cpu"), False)
        outs: list[list[int]] = [[], []]
        proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[],
                                      added=[(i, p, [0] * 5, o) for i, (p, o) in enumerate(zip(params, outs))]))
        drawn: list[list[int]] = [[], []]
        for logits in steps:
            tokens = proc.apply(logits.clone()).argmax(dim=-1).tolist()
            for row, token in enumerate(tokens):
                drawn[row].append(token)
                bookkeep(outs[row], token)
        return drawn

    def sync(out, token):
        out.append(token)

    def placeholder(out, token):  # the token itself is not known yet: -1 until the next step reads it
        out.append(-1)

    pending: dict[int, int] = {}

    def replaced(out, token):  # the previous placeholder becomes its token, this one a placeholder
        if out and out[-1] == -1:
            out[-1] = pending[id(out)]
        pending[id(out)] = token
        out.append(-1)

    lagging: dict[int, int] = {}

    def lag_in_length(out, token):  # no placeholder: the list grows a step late
        if id(out) in lagging:
            out.append(lagging[id(out)])
        lagging[id(out)] = token

    expected = run(sync)
    assert run(placeholder) == expected and run(replaced) == expected
    assert run(lag_in_length) != expected
