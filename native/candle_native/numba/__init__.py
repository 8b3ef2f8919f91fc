"""The numba CPU backend: the backend class, its kernels (kernels/), the row pool and decode
threads it runs them on, blocked attention, the accelerated parts built on those kernels
(parts/: the fused Whisper encoder and decode step, the LLaMA decode step), and the kernel-cache
warm-up (`python -m candle_native.numba.warm`). Importing this package does not import numba; using it does."""
