"""PRM architectures vLLM 0.32 lacks, registered through vLLM's plugin mechanism.

`Qwen2ForPrmModel` is Skywork-o1-Open-PRM-Qwen-2.5 (1.5B and 7B): a Qwen2 decoder with a
trl-style value head, `v_head.summary = Linear(hidden_size, 1)` (its dropout is off at
inference), one raw value per token. Skywork's reward for a step is sigmoid(value) at the
step token that closes it; the `skywork` adapter applies the sigmoid, so the pooler here
returns raw values (token_classify, ALL pooling: one row per computed token).

vLLM finds it through `tts.backends.vllm.plugins.register`, the `vllm.general_plugins`
entry point (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.model_executor.layers.pooler import Pooler
from vllm.model_executor.layers.pooler.tokwise import pooler_for_token_classify
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.interfaces_base import default_pooling_type
from vllm.model_executor.models.qwen2 import Qwen2Model
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix
from vllm.sequence import IntermediateTensors

class ValueHead(nn.Module):
    """Skywork's value head: `summary`, a Linear(hidden, 1) with bias (the checkpoint's
    `v_head.summary.weight` / `.bias`), run in the head dtype."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden_states.to(self.summary.weight.dtype))


@default_pooling_type(tok_pooling_type="ALL")
class Qwen2ForPrmModel(nn.Module, SupportsPP):
    """Qwen2 plus a value head: token_classify pooling of one raw value per token."""

    is_pooling_model = True
    pooler: Pooler
    hf_to_vllm_mapper = Qwen2Model.hf_to_vllm_mapper
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = Qwen2Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.head_dtype = vllm_config.model_config.head_dtype
        self.v_head = ValueHead(config.hidden_size, self.head_dtype)
        pooler_config = vllm_config.model_config.pooler_config
        assert pooler_config is not None
        self.pooler = pooler_for_token_classify(pooler_config)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        hidden_states = self.model(input_ids, positions, intermediate_tensors, inputs_embeds)
        if isinstance(hidden_states, IntermediateTensors):
            return hidden_states
        return self.v_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # the checkpoint keeps the causal LM's output head beside the value head: unused here
        loader = AutoWeightsLoader(self, ignore_unexpected_prefixes=["lm_head."])
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)

