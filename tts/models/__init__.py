"""Model registry, cache and provisioning (``tts models list`` / ``tts models pull``).

Importing this package is cheap: torch and transformers load only inside ``pull``.
"""

from tts.models.cache import (
    ModelNotPresentError,
    cache_dir,
    is_present,
    local_path,
)
from tts.models.listing import list_models
from tts.models.provision import ProvisionError, pull
from tts.models.resolve import resolve_model
from tts.models.registry import (
    DEFAULT_GENERATOR,
    DEFAULT_VERIFIER,
    REGISTRY,
    ModelSpec,
    get_spec,
    model_keys,
)

__all__ = [
    "DEFAULT_GENERATOR",
    "DEFAULT_VERIFIER",
    "REGISTRY",
    "ModelNotPresentError",
    "ModelSpec",
    "ProvisionError",
    "cache_dir",
    "get_spec",
    "is_present",
    "list_models",
    "local_path",
    "model_keys",
    "pull",
    "resolve_model",
]
