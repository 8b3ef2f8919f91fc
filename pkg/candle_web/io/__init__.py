"""File formats: safetensors, npy/npz, GGUF, CTranslate2 model.bin and WAV.

Submodules are imported on demand (`from candle_web.io import safetensors`), so importing the
package costs nothing."""
