"""GGML quantized tensors: block types, numpy reference (de)quantization, QTensor."""

from .ggml_dtype import DEQUANTIZABLE, QK_K, QUANTIZABLE, GgmlDType
from .qtensor import QTensor, dequantize, qmatmul_ref, quantize

__all__ = ["GgmlDType", "QTensor", "dequantize", "quantize", "qmatmul_ref", "QK_K",
           "DEQUANTIZABLE", "QUANTIZABLE"]
