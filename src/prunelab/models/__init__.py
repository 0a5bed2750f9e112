"""Models: loading by hub id or path, and the per-architecture adapters (the only code that knows
Hugging Face attribute paths)."""

from prunelab.models.adapter import ROLES, ModelAdapter
from prunelab.models.architectures import ARCHITECTURES, Architecture, architecture_for
from prunelab.models.loading import (
    LoadedModel, cache_identity, identity_key, load_model, model_identity, resolve_device, wrap_model,
)
from prunelab.models.spec import ModelSpec

__all__ = [
    "ARCHITECTURES", "Architecture", "LoadedModel", "ModelAdapter", "ModelSpec", "ROLES",
    "architecture_for", "cache_identity", "identity_key", "load_model", "model_identity", "resolve_device", "wrap_model",
]
