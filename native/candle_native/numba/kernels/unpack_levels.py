"""The int8 levels of the GGML block types that dominate published GGUF files (Q4_K, Q5_0,
Q6_K), written straight into the unpacked array (quant_unpack.py) instead of through numpy's
temporaries: Qwen2.5-0.5B's Q4_K_M file unpacked in 1.5 s of CPU with numpy, most of a server's
start. Serial and without the GIL: quant_unpack's callers run weights on threads of their own
(a parallel kernel launched from several threads would start an OpenMP team per thread; see
TextScheduler._set_up in api/scheduler.py on why one team matters). The bit layouts are
quant_unpack's numpy unpackers', which tests/native/test_quant_unpack.py holds these to, level
for level."""

import numpy as np
from numba import njit


def _levels_kernel(fn):
    return njit(cache=True, nogil=True)(fn)


@_levels_kernel
def q4_k_levels(blocks, levels):
    """blocks u8[n, 144] -> levels i8[n, 256]: byte l of 32-byte chunk c of qs (from byte 16)
    holds element 64c + l in its low nibble and 64c + 32 + l in its high one."""
    for i in range(blocks.shape[0]):
        block = blocks[i]
        out = levels[i]
        for c in range(4):
            for lane in range(32):
                byte = block[16 + 32 * c + lane]
                out[64 * c + lane] = np.int8(byte & 15)
                out[64 * c + 32 + lane] = np.int8(byte >> 4)


@_levels_kernel
def q5_0_levels(blocks, levels):
    """blocks u8[n, 22] -> levels i8[n, 32]: element l's low 4 bits in the low (l < 16) or high
    nibble of qs[l % 16] (from byte 6), its fifth bit is bit l of the little-endian u32 at
    byte 2 (bit l % 8 of byte 2 + l // 8); minus 16."""
    for i in range(blocks.shape[0]):
        block = blocks[i]
        out = levels[i]
        for lane in range(16):
            byte = block[6 + lane]
            low_top = (block[2 + (lane >> 3)] >> (lane & 7)) & 1
            high_top = (block[4 + (lane >> 3)] >> (lane & 7)) & 1
            out[lane] = np.int8((byte & 15) | (low_top << 4)) - np.int8(16)
            out[lane + 16] = np.int8((byte >> 4) | (high_top << 4)) - np.int8(16)


@_levels_kernel
def q6_k_levels(blocks, levels):
    """blocks u8[n, 210] -> levels i8[n, 256]: in 128-element half h, element 32j + l takes
    its low 4 bits from ql[64h + 32 (j & 1) + l] at shift 4 (j >> 1) and its top 2 from
    qh[32h + l] (from byte 128) at shift 2j; minus 32."""
    for i in range(blocks.shape[0]):
        block = blocks[i]
        out = levels[i]
        for half in range(2):
            for j in range(4):
                low_base = 64 * half + 32 * (j & 1)
                low_shift = 4 * (j >> 1)
                for lane in range(32):
                    low = (np.int64(block[low_base + lane]) >> low_shift) & 15
                    top = (np.int64(block[128 + 32 * half + lane]) >> (2 * j)) & 3
                    out[128 * half + 32 * j + lane] = np.int8(low | (top << 4)) - np.int8(32)
