"""Weights kept as IEEE half precision (float16) in memory and widened to f32 inside the kernels.

Why: a decode step of a small model streams every weight from DRAM once per token and is bound
by bytes read (measured here: one core reads ~6 GB/s). Checkpoints such as CTranslate2's
Whisper files store float16 weights; widened to f32 at load they cost twice the bytes for the
same values. f16 -> f32 is exact (every half value, subnormals, inf and NaN included, is an f32
value), so products and sums are those of the f32 path up to summation order.

Numba has no float16 arithmetic on the CPU, so the weights travel as their uint16 bit patterns
and `widen` turns one into f32 with LLVM's `fpext half -> float`, which x86 with F16C (every
AVX2 CPU) compiles to the vector instruction vcvtph2ps; on float32 input `widen` is the identity,
so one kernel body serves both storage types (numba compiles one specialisation per type).
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

HALF_BITS = np.uint16  # how f16 weights are passed to the kernels


@intrinsic
def widen(typingctx, value):
    """f32 value of `value`: a float32 as is, a uint16 read as the bits of an IEEE half."""
    if value == types.float32:
        def identity(context, builder, signature, args):
            return args[0]

        return types.float32(types.float32), identity
    if value == types.uint16:
        def half_to_float(context, builder, signature, args):
            half = builder.bitcast(args[0], ir.HalfType())
            return builder.fpext(half, ir.FloatType())

        return types.float32(types.uint16), half_to_float
    return None


def exact_half_bits(array: np.ndarray):
    """`array` (f32) as the uint16 bits of its float16 copy when that copy holds exactly the same
    values (weights that came from an f16 checkpoint), else None (an f32 checkpoint: narrowing
    would round). NaN never compares equal, so an array holding one stays f32."""
    half = array.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), array):
        return None
    return half.view(HALF_BITS)
