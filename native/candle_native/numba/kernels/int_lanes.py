"""The integer lane step of the int8 products, as numba intrinsics emitting LLVM vector IR.

numba types `np.int32(a) * np.int32(b)` on int8 operands in int64 (`vpmovzxbq`, `vpmuldq`: 8
products per instruction), and LLVM does not turn such a loop into VNNI. These intrinsics
write the step in LLVM's own vector types instead:

    lanes_step_64: 16 i32 lanes = start[16] + per lane the sum of 4 products (level + 128) * q
                   over 64 elements; then, in f32, f[l] = f[l] + f32(lane) * (s * d) with the
                   quarter's weight scale and the lane's activation scale (int8_rows' epilogue;
                   the activation scales come repeated per lane, one vector load, because
                   building that vector from two scalars cost three instructions per row)
    lanes_step_32: the same over 32 elements into lanes 0..7 (a row's last half block)

The integer part is one `vpdpbusd` (AVX-512 VNNI, 64 u8 x s8 products) per 64 elements where
the compiling CPU has it (`tests/native/test_qint8.py` counts it in `inspect_asm`), two
256-bit `vpdpbusd` of AVX-VNNI where only that exists, and else plain widening multiplies and
adds that LLVM lowers for the CPU at hand (on AVX-512 without VNNI `vpmaddwd`). All three are
exact, so they give the same bits. The f32 epilogue has no fast-math flags: no FMA, no
re-association, so the lanes match the numpy reference (candle_web.quantized.int8_rows).
`CANDLE_NATIVE_INT_LANES=portable` (or `avxvnni`) forces a slower form, for tests that compare
them; the numba cache folder's digest includes it (candle_native/__init__.py).
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

PORTABLE_VARIABLE = "CANDLE_NATIVE_INT_LANES"


def _target_features() -> str:
    """The features numba compiles for: its configured ones, else the host's."""
    if config.CPU_FEATURES:
        return config.CPU_FEATURES
    if config.CPU_NAME and config.CPU_NAME != "host":
        return ""  # a named generic target: assume nothing beyond the baseline
    import llvmlite.binding as llvm  # noqa: PLC0415 (only to read the host's features)
    return llvm.get_host_cpu_features().flatten()


FORMS = ("avx512vnni", "avxvnni", "portable")  # fastest first


def lane_instructions() -> str:
    """'avx512vnni', 'avxvnni' or 'portable': which integer step the kernels compile to (the
    fastest the target has, or the one CANDLE_NATIVE_INT_LANES names)."""
    features = _target_features()
    available = [form for form in FORMS if form == "portable" or f"+{form}" in features]
    forced = os.environ.get(PORTABLE_VARIABLE, "").strip().lower()
    if not forced:
        return available[0]
    if forced not in available:
        raise ValueError(f"{PORTABLE_VARIABLE}={forced!r}: this CPU compiles one of "
                         f"{', '.join(available)}")
    return forced


INSTRUCTIONS = lane_instructions()

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _element_pointer(context, builder, array_type, array, index):
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])


def _vector_at(builder, pointer, vector_type, align):
    return builder.load(builder.bitcast(pointer, vector_type.as_pointer()), align=align)


# (instructions, i32 lanes) -> the LLVM intrinsic of one vpdpbusd on that many lanes.
_VNNI_INTRINSICS = {("avx512vnni", 16): "llvm.x86.avx512.vpdpbusd.512",
                    ("avx512vnni", 8): "llvm.x86.avx512.vpdpbusd.256",
                    ("avxvnni", 8): "llvm.x86.avx512.vpdpbusd.256"}  # VEX-encoded there


def _dot_lanes(builder, start, unsigned, signed, lanes):
    """start + per i32 lane the sum of 4 u8 x s8 products; `unsigned` and `signed` are
    <4 lanes x i8> vectors."""
    name = _VNNI_INTRINSICS.get((INSTRUCTIONS, lanes))
    if name:
        vector = ir.VectorType(_I32, lanes)
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(vector, [vector] * 3), name)
        return builder.call(fn, [start, builder.bitcast(unsigned, vector),
                                 builder.bitcast(signed, vector)])
    if INSTRUCTIONS == "avxvnni" and lanes == 16:
        halves = []
        for h in range(2):
            pick = lambda v, count: builder.shuffle_vector(  # noqa: E731
                v, v, ir.Constant(ir.VectorType(_I32, count), list(range(h * count, (h + 1) * count))))
            halves.append(_dot_lanes(builder, pick(start, 8), pick(unsigned, 32),
                                     pick(signed, 32), 8))
        return builder.shuffle_vector(halves[0], halves[1],
                                      ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    wide = ir.VectorType(_I32, 4 * lanes)
    products = builder.mul(builder.zext(unsigned, wide), builder.sext(signed, wide))
    total = start
    for m in range(4):
        every_fourth = ir.Constant(ir.VectorType(_I32, lanes), [4 * j + m for j in range(lanes)])
        total = builder.add(total, builder.shuffle_vector(products, products, every_fourth))
    return total


def _splat(builder, values, each):
    """<len(values) * each x f32>: each value repeated `each` times, in order."""
    vector = ir.Constant(ir.VectorType(_F32, len(values) * each), ir.Undefined)
    for g, value in enumerate(values):
        for j in range(each):
            vector = builder.insert_element(vector, value, ir.Constant(_I32, g * each + j))
    return vector


def _lanes_step(lanes):
    """The intrinsic for blocks of 4 * lanes elements (16 lanes: 64, 8 lanes: 32)."""
    width = 4 * lanes
    quarters = lanes // 4

    def generic(typingctx, acc, starts, lanes_at, act_scales, levels, level_at, q, *scales):
        signature = types.void(acc, starts, lanes_at, act_scales, levels, level_at, q, *scales)

        def codegen(context, builder, sig, args):
            acc, starts, lanes_at, act_scales, levels, level_at, q = args[:7]
            weight_scales = args[7:7 + quarters]
            int_lanes = ir.VectorType(_I32, lanes)
            float_lanes = ir.VectorType(_F32, lanes)
            bytes_type = ir.VectorType(_I8, width)
            start = _vector_at(builder, _element_pointer(context, builder, sig.args[1], starts,
                                                         lanes_at), int_lanes, 4)
            level_bytes = _vector_at(builder, _element_pointer(context, builder, sig.args[4],
                                                               levels, level_at), bytes_type, 1)
            unsigned = builder.xor(level_bytes, ir.Constant(bytes_type, [0x80] * width))
            signed = _vector_at(builder, _element_pointer(context, builder, sig.args[6], q,
                                                          level_at), bytes_type, 1)
            dots = _dot_lanes(builder, start, unsigned, signed, lanes)
            act = _vector_at(builder, _element_pointer(context, builder, sig.args[3], act_scales,
                                                       lanes_at), float_lanes, 4)
            factor = builder.fmul(_splat(builder, weight_scales, 4), act)
            products = builder.fmul(builder.sitofp(dots, float_lanes), factor)
            acc_pointer = builder.bitcast(
                _element_pointer(context, builder, sig.args[0], acc, context.get_constant(types.intp, 0)),
                float_lanes.as_pointer())
            builder.store(builder.fadd(builder.load(acc_pointer, align=4), products), acc_pointer,
                          align=4)
            return context.get_dummy_value()

        return signature, codegen

    return generic


@intrinsic
def lanes_step_64(typingctx, acc, starts, lanes_at, act_scales, levels, level_at, q,
                  s0, s1, s2, s3):
    """acc[0:16] += the 16 lanes of elements level_at..+63 (see module doc): acc a stack f32
    array; starts (int32) and act_scales (f32, each block's d repeated over its 8 lanes) the
    activation row's per-lane arrays, read at lanes_at = level_at / 4; levels the weight row's
    int8 levels viewed as uint8 and q the int8 activation row, read at level_at; s0..s3 the
    weight scales of the four 16-element quarters."""
    return _lanes_step(16)(typingctx, acc, starts, lanes_at, act_scales, levels, level_at, q,
                           s0, s1, s2, s3)


@intrinsic
def lanes_step_32(typingctx, acc, starts, lanes_at, act_scales, levels, level_at, q, s0, s1):
    """acc[0:8] += the 8 lanes of elements level_at..+31 (a row's last half block)."""
    return _lanes_step(8)(typingctx, acc, starts, lanes_at, act_scales, levels, level_at, q,
                          s0, s1)
