"""The paper's PRMs through the real vLLM engine, as architecture-exact tiny checkpoints.

Each checkpoint is the hub model's published config with 2 layers and hidden size 128,
seeded random weights under the checkpoint's own names, format and files, and the family's
real tokenizer (`tts.models.tiny`: Qwen2.5; Mistral-7B-v0.1's for Math-Shepherd; Llama 3.1's
for RLHFlow). vLLM loads them with the model class it would use for the
published folder (Skywork's through our plugin), so what is tested here is what a GPU run
does with the real weights, except the scores' meaning.

Every score is checked against a plain PyTorch forward of the same weights (transformers'
Qwen2 decoder and the head written out; for the causal-LM PRMs transformers' own model
loaded from the folder, as their model cards do), with the reference's own input construction. All
in float32, where a row does not depend on the batch or the cache.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from tts.backends.base import ScoreRequest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vLLM is not installed")]

ENGINE = dict(kv_cache_bytes=32 << 20, gpu_memory_utilization=None, block_size=32, max_num_seqs=8,
              max_num_batched_tokens=1024, dtype="float32", seed=0, min_tokens_per_seq=1024)
PROBLEM = ("A train leaves the station at 9:00 and travels 60 miles per hour for two hours, then "
           "40 miles per hour for one more hour. How many miles has it travelled in all?")
STEPS = ("In the first two hours it travels 60 * 2 = 120 miles.\n\n",
         "In the third hour it travels 40 more miles.\n\n",
         "So it travels 120 + 40 = 160 miles in all: \\boxed{160}.")
SKYWORK = "tiny:skywork-o1-prm-qwen2.5-1.5b"
QWEN_PRM = "tiny:qwen2.5-math-prm-7b"
MATH_SHEPHERD = "tiny:math-shepherd-mistral-7b-prm"
RLHFLOW = "tiny:rlhflow-llama3.1-8b-prm-deepseek"
MISTRAL_VOCAB = 32_000
TOL = 1e-4  # float32 through two different attention implementations


def _folder(name: str):
    from tts.models.tiny import ensure_tiny

    return ensure_tiny(name)


@pytest.fixture(scope="module")
def skywork():
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = VllmVerifier.from_model(str(_folder(SKYWORK)), adapter="skywork", **ENGINE)
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def qwen_prm(skywork):  # after skywork: both engines live in this process
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = VllmVerifier.from_model(str(_folder(QWEN_PRM)), adapter="qwen_prm", **ENGINE)
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def math_shepherd():
    """Math-Shepherd's scores are prompt log-probs, and vLLM returns those as a top-k list per
    position. A trained PRM puts "+" and "-" at the top after each "ки" (it was trained to
    predict them there), so the default top-20 holds both; random weights do not, so here
    the list is the whole vocabulary and every score is exact."""
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = VllmVerifier.from_model(str(_folder(MATH_SHEPHERD)), adapter="math_shepherd", top_logprobs=MISTRAL_VOCAB,
                                       engine_kwargs={"max_logprobs": MISTRAL_VOCAB}, **ENGINE)
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def rlhflow():
    from tts.backends.vllm.verifier import VllmVerifier

    verifier = VllmVerifier.from_model(str(_folder(RLHFLOW)), adapter="rlhflow", **ENGINE)
    yield verifier
    verifier.close()


def _decoder_and_state(folder):
    """transformers' Qwen2 decoder with the checkpoint's `model.*` weights, and the whole state."""
    import torch
    from transformers import AutoConfig, Qwen2Model

    config = json.loads((folder / "config.json").read_text())
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    hf_config = AutoConfig.for_model("qwen2", **fields)
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    state = {}
    for shard in weights:  # one file, or the shards of a sharded checkpoint
        if shard.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(shard)))
        else:
            state.update(torch.load(shard, map_location="cpu", weights_only=True))
    state = {k: v.float() for k, v in state.items()}
    decoder = Qwen2Model(hf_config).float().eval()
    missing, unexpected = decoder.load_state_dict(
        {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return decoder, state


def _hidden(decoder, ids: list[int]):
    import torch

    with torch.no_grad():
        return decoder(input_ids=torch.tensor([ids])).last_hidden_state[0]


def skywork_reference(folder, problem: str, steps) -> list[float]:
    """Skywork's own recipe (skywork-o1-prm-inference `prepare_input` and `derive_step_rewards`):
    ids of bos + problem + "\\n", then each step's ids and the "\\n" step token; the reward of
    a step is sigmoid(v_head) at its step token."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    step_token = tok.encode("\n", add_special_tokens=False)
    ids = tok.encode(tok.bos_token + problem.strip() + "\n", add_special_tokens=False)
    flags = [0] * len(ids)
    for step in steps:
        piece = tok.encode(step.strip(), add_special_tokens=False) + step_token
        ids += piece
        flags += [0] * (len(piece) - 1) + [1]
    decoder, state = _decoder_and_state(folder)
    values = _hidden(decoder, ids) @ state["v_head.summary.weight"].T + state["v_head.summary.bias"]
    return [float(torch.sigmoid(values[i, 0])) for i, flag in enumerate(flags) if flag]


def qwen_prm_reference(folder, problem: str, steps) -> list[float]:
    """The model card's recipe: the chat template with the steps joined by "<extra_0>"; the
    reward of a step is softmax(score head)[1] at its "<extra_0>"."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
                {"role": "user", "content": problem},
                {"role": "assistant", "content": "<extra_0>".join(s.strip() for s in steps) + "<extra_0>"}]
    ids = tok.encode(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
    sep = tok.encode("<extra_0>", add_special_tokens=False)
    assert sep == [151651]  # vLLM's Qwen2ForProcessRewardModel default step_tag_id
    decoder, state = _decoder_and_state(folder)
    hidden = _hidden(decoder, ids)
    inner = torch.relu(hidden @ state["score.0.weight"].T + state["score.0.bias"])
    logits = inner @ state["score.2.weight"].T + state["score.2.bias"]
    probs = torch.softmax(logits, dim=-1)[:, 1]
    return [float(probs[i]) for i, t in enumerate(ids) if t == sep[0]]


def _causal_lm(folder):
    """The checkpoint as its model card loads it: transformers' own class, from the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def math_shepherd_reference(folder, problem: str, steps) -> list[float]:
    """The model card's recipe: "{question} {output}" with output "Step 1: {step} ки\\nStep 2:
    ... ки", tokenized with the tokenizer's BOS; the reward of a step is softmax over the
    logits of "+" and "-" (`encode("+ -")[1:]`) at its "ки" (`encode("ки")[-1]`), P("+")."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    candidate_tokens = tok.encode("+ -")[1:]
    step_tag_id = tok.encode("ки")[-1]
    assert (candidate_tokens, step_tag_id) == ([648, 387], 12902)  # the model card's ids
    output = "\n".join(f"Step {i + 1}: {step.strip()} ки" for i, step in enumerate(steps))
    input_id = torch.tensor([tok.encode(f"{problem} {output}")])
    with torch.no_grad():
        logits = _causal_lm(folder)(input_id).logits[:, :, candidate_tokens]
    scores = logits.softmax(dim=-1)[:, :, 0]
    return [float(x) for x in scores[input_id == step_tag_id]]


def rlhflow_reference(folder, problem: str, steps) -> list[float]:
    """The model card's recipe: the conversation grows by a user turn (the problem and the
    first step, then each step alone) and an assistant "+" turn; the reward of step k is
    softmax over the logits of "+" and "-" (`encode(...)[-1]`) at position -3 of the
    conversation up to step k's "+" turn (the token before "+<|eot_id|>"), P("+")."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    candidate_tokens = [tok.encode("+")[-1], tok.encode("-")[-1]]
    model = _causal_lm(folder)
    conversation, rewards = [], []
    for k, step in enumerate(steps):
        text = problem + " " + step if k == 0 else step
        conversation += [{"content": text, "role": "user"}, {"content": "+", "role": "assistant"}]
        input_ids = tok.apply_chat_template(conversation, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids).logits[:, -3, candidate_tokens]
        rewards.append(float(logits.softmax(dim=-1)[0, 0]))
    return rewards


@pytest.mark.parametrize("name", [SKYWORK, QWEN_PRM, MATH_SHEPHERD, RLHFLOW])
def test_tiny_checkpoints_keep_the_published_config_and_format(name: str) -> None:
    from tts.models.tiny import SHAPE, _weight_files, published

    folder = _folder(name)
    facts = published(name.removeprefix("tiny:"))
    config = json.loads((folder / "config.json").read_text())
    for key, value in facts["config"].items():  # every published field, the shape shrunk
        assert config[key] == SHAPE.get(key, value) or key == "max_window_layers", key
    weights = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors")]
    published_format = ".safetensors" if any(f.endswith(".safetensors") for f in facts["files"]) else ".bin"
    assert weights and all(w.endswith(published_format) for w in weights)
    if name in (MATH_SHEPHERD, RLHFLOW):  # never built by a tts that wrote one file for shards
        names, index = _weight_files(facts)
        assert sorted(weights) == names and len(names) == {MATH_SHEPHERD: 2, RLHFLOW: 4}[name]
        weight_map = json.loads((folder / index).read_text())["weight_map"]
        assert sorted(set(weight_map.values())) == names


def test_math_shepherd_and_rlhflow_tokenizers_keep_their_own_settings() -> None:
    """The family's tokenizer settings, overridden only by what the model's facts give: BOS
    added and no chat template for Math-Shepherd; Llama 3.1 Instruct's template and eos for
    RLHFlow."""
    from transformers import AutoTokenizer

    from tts.models.tokenizers import LLAMA31_CHAT_TEMPLATE

    folder = _folder(MATH_SHEPHERD)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (config["add_bos_token"], config["add_eos_token"], config["bos_token"], config["eos_token"]) == (
        True, False, "<s>", "</s>")
    assert "chat_template" not in config and "pad_token" not in config
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert tok.encode("Q ки")[0] == tok.bos_token_id == 1 and tok.chat_template is None
    folder = _folder(RLHFLOW)
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|begin_of_text|>", "<|eot_id|>", None)
    assert tok.chat_template == LLAMA31_CHAT_TEMPLATE.read_text()
    assert (tok.encode("+")[-1], tok.encode("-")[-1]) == (10, 12)


def test_skywork_plugin_equals_a_reference_forward(skywork) -> None:
    folder = _folder(SKYWORK)
    expected = skywork_reference(folder, PROBLEM, STEPS)
    (scores,), _ = skywork._score([ScoreRequest(PROBLEM, STEPS, (0, 1, 2))])
    assert scores == pytest.approx(expected, abs=TOL)
    assert len(set(round(s, 6) for s in scores)) == 3  # three different rows, not one repeated


def test_qwen_prm_equals_a_reference_forward(qwen_prm) -> None:
    folder = _folder(QWEN_PRM)
    expected = qwen_prm_reference(folder, PROBLEM, STEPS)
    (scores,), _ = qwen_prm._score([ScoreRequest(PROBLEM, STEPS, (2, 0, 1))])
    assert scores == pytest.approx([expected[2], expected[0], expected[1]], abs=TOL)


@pytest.mark.parametrize("which", ["skywork", "qwen_prm"])
def test_prm_requests_read_the_prefix_cache_with_the_same_scores(request, which: str) -> None:
    """One iteration after another, as the search scores them: the newest step of a growing
    path. From the second on, the path before it comes from the cache, and each score
    equals the reference forward of the whole path."""
    verifier = request.getfixturevalue(which)
    reference = skywork_reference if which == "skywork" else qwen_prm_reference
    folder = _folder(SKYWORK if which == "skywork" else QWEN_PRM)
    verifier.reset_prefix_cache()
    problem = PROBLEM + f" ({which})"  # nothing cached by another test
    cached = []
    for k in range(len(STEPS)):
        (scores,), stats = verifier._score([ScoreRequest(problem, STEPS[: k + 1], (k,))])
        assert scores == pytest.approx([reference(folder, problem, STEPS[: k + 1])[k]], abs=TOL)
        cached.append(stats.cached_tokens)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def test_a_scored_row_served_from_the_cache_is_computed_again(skywork) -> None:
    """Scoring an earlier step of a path whose longer version is cached: its row is in the
    cached blocks, so the request runs again without the cache and still gets it right."""
    folder = _folder(SKYWORK)
    skywork.reset_prefix_cache()
    problem = PROBLEM + " (again)" + " Think about it." * 12
    skywork._score([ScoreRequest(problem, STEPS, (2,))])
    reruns = skywork.reruns
    (scores,), _ = skywork._score([ScoreRequest(problem, STEPS, (0, 2))])
    expected = skywork_reference(folder, problem, STEPS)
    assert scores == pytest.approx([expected[0], expected[2]], abs=TOL)
    assert skywork.reruns == reruns + 1


def test_math_shepherd_equals_a_reference_forward(math_shepherd) -> None:
    folder = _folder(MATH_SHEPHERD)
    expected = math_shepherd_reference(folder, PROBLEM, STEPS)
    (scores,), _ = math_shepherd._score([ScoreRequest(PROBLEM, STEPS, (2, 0, 1))])
    assert scores == pytest.approx([expected[2], expected[0], expected[1]], abs=TOL)
    assert len(set(round(s, 6) for s in scores)) == 3


def test_math_shepherd_requests_get_no_prefix_cache_hits(math_shepherd, monkeypatch) -> None:
    """vLLM 0.32 serves no prompt-logprob request from the prefix cache (the log-probs of
    cached positions would be missing): a growing path, and the same path scored again, are
    computed in full. If this fails, vLLM has changed and Math-Shepherd can read the cache
    too. (With the default top-20 log-probs, as a real run asks: the scores do not matter.)"""
    monkeypatch.setattr(math_shepherd, "top_logprobs", 20)
    math_shepherd.reset_prefix_cache()
    problem = PROBLEM + " (math-shepherd cache)"
    cached = [math_shepherd._score([ScoreRequest(problem, STEPS[: k + 1], (k,))])[1].cached_tokens
              for k in (0, 1, 2, 2)]
    assert cached == [0, 0, 0, 0]
    assert math_shepherd.adapter.reads_prefix_cache is False  # what the summary says ("not cached (vLLM)")


def test_rlhflow_equals_a_reference_forward(rlhflow) -> None:
    folder = _folder(RLHFLOW)
    expected = rlhflow_reference(folder, PROBLEM, STEPS)
    (scores,), stats = rlhflow._score([ScoreRequest(PROBLEM, STEPS, (2, 0, 1))])
    assert scores == pytest.approx([expected[2], expected[0], expected[1]], abs=TOL)
    assert stats.num_requests == 3  # NEXT_TOKEN: one request per scored step
    assert len(set(round(s, 6) for s in scores)) == 3


def test_rlhflow_requests_read_the_prefix_cache_with_the_same_scores(rlhflow) -> None:
    """The newest step of a growing path, one iteration after another: from the second on,
    the conversation before it (system turn, earlier user and "+" turns) comes from the
    cache, and each score equals the reference forward of the whole conversation."""
    folder = _folder(RLHFLOW)
    rlhflow.reset_prefix_cache()
    problem = PROBLEM + " (rlhflow)"
    expected = rlhflow_reference(folder, problem, STEPS)
    cached = []
    for k in range(len(STEPS)):
        (scores,), stats = rlhflow._score([ScoreRequest(problem, STEPS[: k + 1], (k,))])
        assert scores == pytest.approx([expected[k]], abs=TOL)
        cached.append(stats.cached_tokens)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    assert rlhflow.adapter.reads_prefix_cache


@pytest.mark.parametrize("name", ["tiny:qwen2.5-math-7b-instruct", MATH_SHEPHERD, RLHFLOW])
def test_codec_decodes_as_transformers_does(name) -> None:
    """`ChatCodec.decode` calls the Rust tokenizer directly where transformers would return the
    same text (`_rust_decode`): Qwen2.5's tokenizer takes that path; whichever path a family's
    tokenizer takes, the text is transformers' own, for special tokens, partial UTF-8 bytes and
    random ids alike."""
    import random

    from transformers import AutoTokenizer

    from tts.backends.codec import ChatCodec

    tok = AutoTokenizer.from_pretrained(str(_folder(name)))
    codec = ChatCodec(tok)
    if name.startswith("tiny:qwen2.5"):
        assert codec._decode is not None  # the fast path is taken where it matters
    rng = random.Random(0)
    text = "Steps: 3·4 = 12, √9 = 3, ∑ 中文 🙂 \\boxed{12}\n\n"
    ids = tok.encode(text, add_special_tokens=False)
    cases = [ids, ids[:-1], ids[1:], list(tok.all_special_ids) + ids + list(tok.all_special_ids), [],
             *([rng.randrange(len(tok)) for _ in range(rng.randrange(1, 300))] for _ in range(50))]
    for case in cases:
        assert codec.decode(case) == tok.decode(case, skip_special_tokens=True)
    tok.clean_up_tokenization_spaces = True  # a tokenizer that cleans up goes transformers' way
    assert ChatCodec(tok)._decode is None
