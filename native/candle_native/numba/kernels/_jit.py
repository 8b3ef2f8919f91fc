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


# `fastmath=False` is spelled out: numba gives a kernel that does not set fastmath its caller's
# flags (Flags.inherit_if_not_set), so an exact kernel called from a FAST_REDUCTIONS kernel
# compiled with 'arcp' (x / 127 became x * (1/127), an ulp off) -- and the numba cache, whose
# key has no flags, then served that code to direct calls too.
def exact_parallel_kernel(fn):
    """A parallel kernel with strict IEEE semantics (no FMA contraction): for results that must
    be bit-identical to numpy's separately rounded multiply and add."""
    return njit(cache=True, parallel=True, nogil=True, fastmath=False)(fn)


# Only FMA contraction: LLVM may not re-associate a sum, so a kernel written with explicit
# accumulator lanes gives the same bits however it is unrolled or vectorised, and two kernels
# that do the same per-lane arithmetic agree bit for bit (qrows.py relies on it).
STRICT_LANES = {"contract"}


def strict_kernel(fn):
    """A serial kernel whose sums keep the order written (see STRICT_LANES)."""
    return njit(cache=True, fastmath=STRICT_LANES, nogil=True)(fn)


def strict_inline(fn):
    """A strict helper inlined into its callers at numba's IR level: a stack array passed to a
    call LLVM does not inline stays in memory (no SROA), and the lanes go through loads and
    stores."""
    return njit(cache=True, fastmath=STRICT_LANES, nogil=True, inline="always")(fn)


def exact_kernel(fn):
    """A serial kernel with strict IEEE semantics (no fast-math flags at all): for results that
    a numpy reference reproduces bit for bit (the int8 products' epilogue, qint8.py)."""
    return njit(cache=True, nogil=True, fastmath=False)(fn)


def exact_inline(fn):
    """An exact helper inlined into its callers at numba's IR level (see strict_inline)."""
    return njit(cache=True, nogil=True, inline="always", fastmath=False)(fn)
