"""File formats: safetensors, npy/npz, GGUF, CTranslate2 model.bin, PyTorch checkpoints (pytorch,
read by its own pickle interpreter pickle_vm, with pickle_values' limits, never by Python's pickle)
and WAV; audio decoding (any container, to Whisper's 16 kHz mono) and its resampler; weights by
name over any of them (weights.py) and one opener for a model's files (checkpoint.py).

Submodules are imported on demand (`from candle_web.io import safetensors`, or
`candle_web.io.safetensors` after `import candle_web`), so importing the package costs nothing."""

from ..core._lazy import lazy_submodules

__getattr__, __dir__ = lazy_submodules(__name__, ("safetensors", "npz", "gguf", "ct2", "wav",
                                                  "audio", "resample", "weights", "checkpoint",
                                                  "pytorch", "pickle_vm", "pickle_values", "tfjs",
                                                  "image"),
                                       globals())
