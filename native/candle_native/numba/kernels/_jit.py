"""Shared compilation settings of the numba kernels."""

from numba import njit

# Re-association and contraction (FMA) let LLVM vectorise reductions; 'arcp' and 'nsz' cost at
# most an ulp. Not 'nnan'/'ninf' (masked attention relies on -inf) and not 'afn' (exp, tanh and
# erf must stay accurate).
FAST_REDUCTIONS = {"reassoc", "contract", "arcp", "nsz"}


def kernel(fn):
    """A serial kernel (cached machine code)."""
    return njit(cache=True, fastmath=FAST_REDUCTIONS, nogil=True)(fn)


def parallel_kernel(fn):
    """A kernel whose outer ``prange`` loop is split over threads."""
    return njit(cache=True, fastmath=FAST_REDUCTIONS, parallel=True, nogil=True)(fn)


def exact_parallel_kernel(fn):
    """A parallel kernel with strict IEEE semantics (no FMA contraction): for results that must
    be bit-identical to numpy's separately rounded multiply and add."""
    return njit(cache=True, parallel=True, nogil=True)(fn)
