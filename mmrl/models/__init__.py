"""Model loading: the embedded models the package ships, local/hub checkpoints and GGUF files."""

from mmrl.cache import EMBEDDED_NAME
from mmrl.models.loading import is_embedded, load_model, load_tokenizer, resolve
from mmrl.models.shipped import shipped_model

__all__ = ["EMBEDDED_NAME", "is_embedded", "load_model", "load_tokenizer", "resolve", "shipped_model"]
