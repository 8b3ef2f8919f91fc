"""Numba kernels of the native CPU backend (imported only once numba is known to import).

Every kernel is compiled with ``cache=True`` (the cache folder is chosen in candle_native's
``__init__``) and with fastmath limited to re-association and contraction: that lets LLVM
vectorise f32 reductions, the whole point of these kernels, while NaN and inf still behave as in
numpy (no ``nnan``/``ninf``: masks use -inf) and transcendental functions stay exact (no ``afn``).

Kernels that exist in a serial and a parallel flavour are separate functions on purpose: numba's
on-disk cache keys entries by function, not by the ``parallel`` flag, so one Python function
compiled twice would make the two flavours overwrite each other's cache entries.
"""

from .activations import (gelu_erf_parallel, gelu_erf_serial, silu_mul_parallel, silu_mul_serial,
                          silu_parallel, silu_serial)
from .attention import attention_rows
from .norms import layer_norm_rows, log_softmax_serial, rms_norm_rows, softmax_serial
from .qmatmul import dequantize_rows_into, qmatmul_g16, qmatmul_g32
from .rope import rope_half_rows, rope_interleaved_rows

__all__ = ["gelu_erf_parallel", "gelu_erf_serial", "silu_mul_parallel", "silu_mul_serial",
           "silu_parallel", "silu_serial", "attention_rows",
           "layer_norm_rows", "log_softmax_serial", "rms_norm_rows", "softmax_serial",
           "dequantize_rows_into", "qmatmul_g16", "qmatmul_g32", "rope_half_rows",
           "rope_interleaved_rows"]
