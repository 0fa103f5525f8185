"""The paper's PRMs through the real vLLM engine, as architecture-exact tiny checkpoints.

Each checkpoint is the hub model's published config with 2 layers and hidden size 128,
seeded random weights under the checkpoint's own names and format, and the real Qwen2.5
tokenizer (`tts.models.tiny`). vLLM loads them with the model class it would use for the
published folder (Skywork's through our plugin), so what is tested here is what a GPU run
does with the real weights, except the scores' meaning.

Every score is checked against a plain PyTorch forward of the same weights (transformers'
Qwen2 decoder and the head written out), with the reference's own input construction. All
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


def _decoder_and_state(folder):
    """transformers' Qwen2 decoder with the checkpoint's `model.*` weights, and the whole state."""
    import torch
    from transformers import AutoConfig, Qwen2Model

    config = json.loads((folder / "config.json").read_text())
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    hf_config = AutoConfig.for_model("qwen2", **fields)
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if weights[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(weights[0]))
    else:
        state = torch.load(weights[0], map_location="cpu", weights_only=True)
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


@pytest.mark.parametrize("name", [SKYWORK, QWEN_PRM])
def test_tiny_checkpoints_keep_the_published_config_and_format(name: str) -> None:
    from tts.models.tiny import SHAPE, published

    folder = _folder(name)
    facts = published(name.removeprefix("tiny:"))
    config = json.loads((folder / "config.json").read_text())
    for key, value in facts["config"].items():  # every published field, the shape shrunk
        assert config[key] == SHAPE.get(key, value) or key == "max_window_layers", key
    weights = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors")]
    published_format = ".safetensors" if any(f.endswith(".safetensors") for f in facts["files"]) else ".bin"
    assert weights and all(w.endswith(published_format) for w in weights)


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
