"""GGML tensor types: their ids in GGUF files, block sizes and bytes per block.

A GGML "type" packs ``block_size`` consecutive elements of a row into ``type_size`` bytes.
Plain types (F32, F16, ...) are blocks of one element. The ids are the ``ggml_type`` values that
GGUF tensor infos store, so they must never be renumbered.

Every id that ggml currently defines is listed, so that a GGUF file holding, say, IQ4_XS tensors
still parses (offsets and sizes are known); only the types in :data:`DEQUANTIZABLE` can be turned
into floats here.
"""

from __future__ import annotations

import enum

from ..core.errors import FormatError, ShapeError

QK_K = 256  # elements per super-block of the k-quants
QK_LEGACY = 32  # elements per block of Q4_0 ... Q8_1


class GgmlDType(enum.IntEnum):
    """A GGML tensor type; the integer value is the id stored in GGUF files."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41

    @property
    def block_size(self) -> int:
        """Elements per block."""
        return _LAYOUT[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return _LAYOUT[self][1]

    @property
    def is_quantized(self) -> bool:
        return self.block_size > 1

    @classmethod
    def from_id(cls, type_id: int, context: str = "") -> "GgmlDType":
        """The type for a GGUF type id; an unknown id is a FormatError naming ``context``."""
        try:
            return cls(type_id)
        except ValueError:
            where = f" ({context})" if context else ""
            raise FormatError(f"unknown GGML type id {type_id}{where}; known ids: "
                              f"{sorted(int(t) for t in cls)}") from None

    @classmethod
    def parse(cls, name) -> "GgmlDType":
        """Accept a GgmlDType, its name ('q4_k', 'Q4_K') or its id."""
        if isinstance(name, GgmlDType):
            return name
        if isinstance(name, str):
            key = name.upper()
            if key in cls.__members__:
                return cls.__members__[key]
            raise FormatError(f"unknown GGML type name {name!r}")
        return cls.from_id(int(name))

    def n_bytes(self, n_elements: int, context: str = "") -> int:
        """Bytes taken by ``n_elements`` elements; they must fill whole blocks."""
        if n_elements % self.block_size:
            where = f" for {context}" if context else ""
            raise ShapeError(f"{self.name} packs {self.block_size} elements per block, but "
                             f"{n_elements} elements were given{where}")
        return n_elements // self.block_size * self.type_size

    def row_bytes(self, row_length: int, context: str = "") -> int:
        """Bytes of one row of ``row_length`` elements (rows never share a block)."""
        if row_length % self.block_size:
            where = f" of {context}" if context else ""
            raise ShapeError(f"{self.name} rows must be a multiple of {self.block_size} elements; "
                             f"the last dim{where} is {row_length}")
        return row_length // self.block_size * self.type_size


# (elements per block, bytes per block), as in ggml-common.h.
_LAYOUT = {
    GgmlDType.F32: (1, 4),
    GgmlDType.F16: (1, 2),
    GgmlDType.Q4_0: (QK_LEGACY, 2 + 16),
    GgmlDType.Q4_1: (QK_LEGACY, 2 + 2 + 16),
    GgmlDType.Q5_0: (QK_LEGACY, 2 + 4 + 16),
    GgmlDType.Q5_1: (QK_LEGACY, 2 + 2 + 4 + 16),
    GgmlDType.Q8_0: (QK_LEGACY, 2 + 32),
    # f16 d, f16 s, 32 x i8. (gguf-py 0.19 still lists 40 bytes, the pre-2024 f32 layout;
    # ggml-common.h asserts 2*sizeof(ggml_half) + 32.)
    GgmlDType.Q8_1: (QK_LEGACY, 2 + 2 + 32),
    GgmlDType.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    GgmlDType.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GgmlDType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),
    GgmlDType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GgmlDType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GgmlDType.Q8_K: (QK_K, 4 + QK_K + 2 * (QK_K // 16)),
    GgmlDType.IQ2_XXS: (QK_K, 2 + QK_K // 4),
    GgmlDType.IQ2_XS: (QK_K, 2 + QK_K // 4 + QK_K // 32),
    GgmlDType.IQ3_XXS: (QK_K, 2 + QK_K // 4 + QK_K // 8),
    GgmlDType.IQ1_S: (QK_K, 2 + QK_K // 8 + QK_K // 16),
    GgmlDType.IQ4_NL: (32, 2 + 16),
    GgmlDType.IQ3_S: (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GgmlDType.IQ2_S: (QK_K, 2 + QK_K // 4 + QK_K // 16),
    GgmlDType.IQ4_XS: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GgmlDType.I8: (1, 1),
    GgmlDType.I16: (1, 2),
    GgmlDType.I32: (1, 4),
    GgmlDType.I64: (1, 8),
    GgmlDType.F64: (1, 8),
    GgmlDType.IQ1_M: (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GgmlDType.BF16: (1, 2),
    GgmlDType.TQ1_0: (QK_K, 2 + 4 * 13),
    GgmlDType.TQ2_0: (QK_K, 2 + 64),
    GgmlDType.MXFP4: (32, 1 + 16),
    GgmlDType.NVFP4: (64, 4 + 32),
    GgmlDType.Q1_0: (128, 2 + 16),
}

# The types this package can dequantize (and the kernels of later backends must cover).
DEQUANTIZABLE = frozenset({
    GgmlDType.F32, GgmlDType.F16, GgmlDType.BF16, GgmlDType.F64,
    GgmlDType.I8, GgmlDType.I16, GgmlDType.I32, GgmlDType.I64,
    GgmlDType.Q4_0, GgmlDType.Q4_1, GgmlDType.Q5_0, GgmlDType.Q5_1, GgmlDType.Q8_0, GgmlDType.Q8_1,
    GgmlDType.Q2_K, GgmlDType.Q3_K, GgmlDType.Q4_K, GgmlDType.Q5_K, GgmlDType.Q6_K, GgmlDType.Q8_K,
})

# The types this package can produce from floats.
QUANTIZABLE = frozenset({
    GgmlDType.F32, GgmlDType.F16, GgmlDType.BF16,
    GgmlDType.Q4_0, GgmlDType.Q4_1, GgmlDType.Q5_0, GgmlDType.Q5_1, GgmlDType.Q8_0,
    GgmlDType.Q4_K, GgmlDType.Q6_K, GgmlDType.Q8_K,
})
