"""PRM adapters: registry, score read-out, formatting and positions (tokenizer only, no model).

The formatting tests use the SmolLM2 tokenizer from the local model cache; they are skipped
when the model has not been provisioned (`tts models pull smollm2-135m-instruct`).
"""

from __future__ import annotations

import math

import pytest

from tts.backends.adapters import ADAPTERS, PromptSpec, ReadKind, ScoreOutput, make_adapter
from tts.backends.adapters.base import label_probability, sigmoid, softmax_positive
from tts.backends.adapters.judge import JudgeAdapter

PROBLEM = "Compute (2+3)*2."
STEPS = ("First, 2+3 = 5.\n\n", "Then 5*2 = 10.\n\n", "So the answer is \\boxed{10}.")
SYSTEM_HEADER = ("<|im_start|>system\nYou check solutions to math problems one step at a time. "
                 "Read the problem and the steps so far, then say whether the last step is "
                 "correct: its arithmetic and logic are right and it follows from the problem "
                 "and the earlier steps.<|im_end|>\n<|im_start|>user\n")


@pytest.fixture(scope="module")
def tokenizer():
    from tts.models.cache import ModelNotPresentError
    from tts.models.resolve import resolve_model

    try:
        path = resolve_model("smollm2-135m-instruct")
    except ModelNotPresentError as err:
        pytest.skip(f"default model not provisioned: {err}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_registry_names_and_unknown_name() -> None:
    assert set(ADAPTERS) == {"judge", "math_shepherd", "rlhflow", "skywork", "qwen_prm"}
    with pytest.raises(ValueError) as err:
        make_adapter("shepherd", tokenizer=None)
    for name in ADAPTERS:
        assert name in str(err.value)


def test_label_probability_sums_variants_and_bounds_missing_side() -> None:
    lp = {1: math.log(0.5), 2: math.log(0.1), 3: math.log(0.2), 9: math.log(0.05)}
    assert label_probability(lp, [1, 2], [3]) == pytest.approx(0.6 / 0.8)
    # " No" absent from the top-k: bounded by the smallest listed probability (0.05).
    assert label_probability(lp, [1], [7]) == pytest.approx(0.5 / 0.55)
    assert label_probability(lp, [7], [3]) == pytest.approx(0.05 / 0.25)
    assert label_probability(lp, [7], [8]) == 0.5


def test_softmax_and_sigmoid() -> None:
    assert softmax_positive([0.0, math.log(3.0)], 1) == pytest.approx(0.75)
    assert sigmoid(0.0) == 0.5
    assert sigmoid(math.log(3.0)) == pytest.approx(0.75)
    assert sigmoid(-800.0) == pytest.approx(0.0)


def test_judge_prompt_text_and_labels(tokenizer) -> None:
    judge = JudgeAdapter(tokenizer)
    specs = judge.build(PROBLEM, STEPS, [1])
    assert len(specs) == 1 and specs[0].kind is ReadKind.NEXT_TOKEN
    assert tokenizer.decode(specs[0].token_ids) == (
        SYSTEM_HEADER + "Problem: Compute (2+3)*2.\n\nStep 1: First, 2+3 = 5.\n\n"
        "Step 2: Then 5*2 = 10.\n\nIs step 2 correct? Answer Yes or No.<|im_end|>\n"
        "<|im_start|>assistant\n")
    yes, no = tokenizer.encode(" Yes"), tokenizer.encode("No")
    assert yes[0] in judge.yes_ids and no[0] in judge.no_ids
    assert set(specs[0].label_ids) == set(judge.yes_ids) | set(judge.no_ids)


def test_judge_prompt_is_a_prefix_extension(tokenizer) -> None:
    judge = JudgeAdapter(tokenizer)
    for k in range(len(STEPS) - 1):
        (short,) = judge.build(PROBLEM, STEPS[: k + 1], [k])
        (longer,) = judge.build(PROBLEM, STEPS + ("Done.",), [k + 1])
        shared = len(short.token_ids) - len(judge.question_ids(k))
        assert longer.token_ids[:shared] == short.token_ids[:shared]
    # Siblings (same parent, different last step) share everything before their own step.
    (a,) = judge.build(PROBLEM, STEPS[:2], [1])
    (b,) = judge.build(PROBLEM, STEPS[:1] + ("Then 5*2 = 12.",), [1])
    parent = sum(len(p) for p in judge.prefix_pieces(PROBLEM, STEPS[:1]))
    assert a.token_ids[:parent] == b.token_ids[:parent] and a.token_ids != b.token_ids


def test_judge_one_request_per_index_and_read(tokenizer) -> None:
    judge = JudgeAdapter(tokenizer)
    specs = judge.build(PROBLEM, STEPS, [2, 0])
    assert [tokenizer.decode(s.token_ids).count("Step ") for s in specs] == [3, 1]
    yes, no = judge.yes_ids[0], judge.no_ids[0]
    outputs = [ScoreOutput(specs[0], logprobs=({yes: math.log(0.3), no: math.log(0.1)},)),
               ScoreOutput(specs[1], logprobs=({yes: math.log(0.1), no: math.log(0.3)},))]
    assert judge.read(outputs) == pytest.approx((0.75, 0.25))


def test_judge_plain_layout_and_bad_inputs(tokenizer) -> None:
    plain = JudgeAdapter(tokenizer, use_chat_template=False)
    (spec,) = plain.build(PROBLEM, STEPS, [0])
    assert tokenizer.decode(spec.token_ids).endswith(
        "Step 1: First, 2+3 = 5.\n\nIs step 1 correct? Answer Yes or No.\n\nAnswer:")
    with pytest.raises(ValueError, match="judge_prompt_file"):
        JudgeAdapter(tokenizer, prompt_file="no-such-prompt.txt")
    with pytest.raises(ValueError, match="indices"):
        plain.build(PROBLEM, STEPS, [3])
    with pytest.raises(ValueError, match="indices"):
        plain.build(PROBLEM, STEPS, [])


def test_math_shepherd_tags_and_positions(tokenizer) -> None:
    adapter = make_adapter("math_shepherd", tokenizer)
    specs = adapter.build(PROBLEM, STEPS, [0, 1])
    assert len(specs) == 1 and specs[0].kind is ReadKind.PROMPT_TOKENS
    ids = specs[0].token_ids
    # Cut after the last scored step (step 2): later steps cannot change causal logits.
    assert tokenizer.decode(ids) == ("Compute (2+3)*2. Step 1: First, 2+3 = 5. ки\n"
                                     "Step 2: Then 5*2 = 10. ки")
    assert len(specs[0].positions) == 2
    for pos in specs[0].positions:
        assert tokenizer.decode(ids[: pos + 1]).endswith(" ки")
        assert not tokenizer.decode(ids[:pos]).endswith(" ки")
    assert specs[0].positions[-1] == len(ids) - 1
    assert specs[0].label_ids == (tokenizer.encode("+")[-1], tokenizer.encode("-")[-1])
    plus, minus = specs[0].label_ids
    out = ScoreOutput(specs[0], logprobs=({plus: math.log(0.6), minus: math.log(0.2)},
                                          {plus: math.log(0.2), minus: math.log(0.6)}))
    assert adapter.read([out]) == pytest.approx((0.75, 0.25))


def test_rlhflow_turns_and_prefix(tokenizer) -> None:
    adapter = make_adapter("rlhflow", tokenizer)
    specs = adapter.build(PROBLEM, STEPS, [0, 2])
    assert [s.kind for s in specs] == [ReadKind.NEXT_TOKEN] * 2
    text = tokenizer.decode(specs[1].token_ids)
    assert text.endswith("<|im_start|>user\nCompute (2+3)*2. First, 2+3 = 5.<|im_end|>\n"
                         "<|im_start|>assistant\n+<|im_end|>\n<|im_start|>user\nThen 5*2 = 10."
                         "<|im_end|>\n<|im_start|>assistant\n+<|im_end|>\n<|im_start|>user\n"
                         "So the answer is \\boxed{10}.<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>user") == 3
    # The request for step 1 is a token prefix of the one for step 3 (prefix-cache friendly).
    first = specs[0].token_ids
    assert specs[1].token_ids[: len(first)] == first


def test_skywork_step_token_positions(tokenizer) -> None:
    adapter = make_adapter("skywork", tokenizer)
    (spec,) = adapter.build(PROBLEM, STEPS, [0, 2])
    assert spec.kind is ReadKind.POOLING
    newline = tokenizer.encode("\n")[-1]
    assert [spec.token_ids[p] for p in spec.positions] == [newline, newline]
    assert spec.positions[-1] == len(spec.token_ids) - 1
    assert tokenizer.decode(spec.token_ids) == (
        "<|im_start|>Compute (2+3)*2.\nFirst, 2+3 = 5.\nThen 5*2 = 10.\n"
        "So the answer is \\boxed{10}.\n")
    # Step 1 ends with the first appended step token: "<bos>problem\n" + step 1 + "\n".
    head = len(tokenizer.encode("<|im_start|>Compute (2+3)*2.\n"))
    assert spec.positions[0] == head + len(tokenizer.encode("First, 2+3 = 5."))
    out = ScoreOutput(spec, values=((0.0,), (math.log(3.0),)))
    assert adapter.read([out]) == pytest.approx((0.5, 0.75))


def test_qwen_prm_separator_positions(tokenizer) -> None:
    adapter = make_adapter("qwen_prm", tokenizer)
    (spec,) = adapter.build(PROBLEM, STEPS, [1, 2, 0])
    ids = spec.token_ids
    assert spec.kind is ReadKind.POOLING and len(spec.positions) == 3
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\nFirst, 2+3 = 5.<extra_0>Then 5*2 = 10.<extra_0>"
                         "So the answer is \\boxed{10}.<extra_0>")
    assert max(spec.positions) == len(ids) - 1  # ends at its last scored token: never a cache hit
    ends = [len(tokenizer.decode(ids[: p + 1])) for p in spec.positions]
    seps = [i + len("<extra_0>") for i in range(len(text)) if text.startswith("<extra_0>", i)]
    assert ends == [seps[1], seps[2], seps[0]]
    out = ScoreOutput(spec, values=((0.0, 0.0), (0.0, math.log(3.0)), (math.log(3.0), 0.0)))
    assert adapter.read([out]) == pytest.approx((0.5, 0.75, 0.25))


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_adapter_yields_one_score_per_index(tokenizer, name: str) -> None:
    adapter = make_adapter(name, tokenizer)
    indices = [2, 0, 1]
    specs = adapter.build(PROBLEM, STEPS, indices)
    outputs = [_neutral_output(spec) for spec in specs]
    scores = adapter.read(outputs)
    assert len(scores) == len(indices) and all(0.0 <= s <= 1.0 for s in scores)
    # what the engine's lookahead scope reads: one request per index, or one per path
    assert len(specs) == (len(indices) if adapter.request_per_index else 1)


def _neutral_output(spec: PromptSpec) -> ScoreOutput:
    uniform = {t: math.log(0.1) for t in spec.label_ids}
    if spec.kind is ReadKind.NEXT_TOKEN:
        return ScoreOutput(spec, logprobs=(uniform,))
    if spec.kind is ReadKind.PROMPT_TOKENS:
        return ScoreOutput(spec, logprobs=tuple(uniform for _ in spec.positions))
    return ScoreOutput(spec, values=tuple((0.0, 0.0) for _ in spec.positions))
