"""The model zoo, one readable file each; imported on first use (`cw.models.whisper`)."""

from ..core._lazy import lazy_submodules

__getattr__, __dir__ = lazy_submodules(__name__, (
    "whisper", "whisper_decode", "llama", "t5", "t5_training", "bert", "inputs",
    "config_fields"), globals())
