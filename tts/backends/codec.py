"""A generator's text side without its weights: the chat prompt, decoding, token texts.

`VllmGenerator` reads it from its engine's tokenizer; a trace replay (`tts.replay`) loads
the recorded generator's tokenizer alone and gets the same prompts and the same step cuts;
a run measures its problems' prompts with it before any engine loads (`generator_codec`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tts.config.schema import GeneratorConfig


class ChatCodec:
    """Prompt encoding and decoding over one Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._decode = _rust_decode(tokenizer)
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("generator model: its tokenizer defines no eos_token_id")
        self.eos_token_id = int(eos)

    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        """The chat template with a system turn (if non-empty), the problem as the user turn,
        and the assistant header, tokenized without adding special tokens twice."""
        messages = [{"role": "user", "content": problem}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self._decode is not None:
            return self._decode(list(token_ids), skip_special_tokens=True)
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.decode([token_id])
        return text


def _rust_decode(tokenizer: Any) -> Any:
    """The Rust tokenizer's own `decode`, where transformers' `decode` returns exactly what it
    returns: a `TokenizersBackend` whose `_decode` is not overridden and that cleans up no
    spaces (the paper's Qwen2.5 tokenizers, SmolLM2's). transformers' layers around it
    (argument conversion, the batch check, the clean-up test) cost as much as the decode
    itself on a step's tokens, and a run decodes every finished step. Else None."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - an older transformers: its own decode
        return None
    backend = getattr(tokenizer, "_tokenizer", None)
    if (not isinstance(tokenizer, TokenizersBackend) or backend is None
            or type(tokenizer)._decode is not TokenizersBackend._decode
            or getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return None
    return backend.decode


def generator_codec(g: GeneratorConfig) -> Any:
    """The configured generator's text side from its tokenizer alone, before any engine loads
    (the fake backend's: `tts.backends.fake.FakeCodec`). A hub model not here is downloaded
    first (`tts.models.resolve.resolve_model`): its engine needs it next anyway."""
    from tts.config.enums import BackendKind

    if g.backend is BackendKind.fake:
        from tts.backends.fake import FakeCodec

        return FakeCodec()
    from transformers import AutoTokenizer

    from tts.models.resolve import resolve_model

    return ChatCodec(AutoTokenizer.from_pretrained(str(resolve_model(g.model))))
