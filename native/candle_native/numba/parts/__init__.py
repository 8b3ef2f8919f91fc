"""Implementations of the accelerated parts declared in candle_web.backend.parts, registered by
candle_native's __init__: the fused Whisper encoder, the Whisper decoder step and the LLaMA decoder
step, built on the numba kernels."""
