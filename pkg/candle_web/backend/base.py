"""The kernel interface every backend implements.

Arrays passed in and out are the backend's own ndarrays (numpy or cupy). Floating point work
arrives as f32 or f64 only: the tensor layer widens f16/bf16 before calling and narrows after,
so kernels never see half precision. Shapes are checked by the tensor layer; kernels may
assume valid input. Every backend is tested op by op against `NumpyBackend`.
"""

from __future__ import annotations

UNARY_OPS = ("exp", "log", "sin", "cos", "tanh", "abs", "sqr", "sqrt", "recip", "neg", "gelu",
             "gelu_erf", "erf", "relu", "silu", "floor", "ceil", "round", "sign", "sigmoid")
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_OPS = ("sum", "max", "min")
ARG_REDUCE_OPS = ("argmax", "argmin")
ACTIVATIONS = ("none", "relu", "leaky", "relu6")  # conv2d_bias_act's


class Backend:
    """Primitive table. Subclasses override what they accelerate; see NumpyBackend."""

    name = "abstract"
    xp = None  # the array module (numpy or cupy): shape ops use its generic API

    # -- host transfer -------------------------------------------------------------------
    def from_numpy(self, arr):
        raise NotImplementedError

    def to_numpy(self, arr):
        raise NotImplementedError

    # -- elementwise ------------------------------------------------------------------------
    def unary(self, op: str, x):
        raise NotImplementedError

    def binary(self, op: str, a, b):
        """Broadcasting binary op; the tensor layer has validated the shapes."""
        raise NotImplementedError

    def compare(self, op: str, a, b):
        """Returns a uint8 array of 0/1."""
        raise NotImplementedError

    def affine(self, x, mul: float, add: float):
        raise NotImplementedError

    def powf(self, x, exponent: float):
        raise NotImplementedError

    def clamp(self, x, lo, hi):
        raise NotImplementedError

    def where(self, cond, on_true, on_false):
        raise NotImplementedError

    def cast(self, x, np_dtype):
        raise NotImplementedError

    # -- reductions ------------------------------------------------------------------------
    def reduce(self, op: str, x, axes: tuple, keepdims: bool):
        raise NotImplementedError

    def arg_reduce(self, op: str, x, axis: int, keepdims: bool):
        """argmax/argmin as uint32 (Candle's index dtype)."""
        raise NotImplementedError

    def cumsum(self, x, axis: int):
        raise NotImplementedError

    # -- linear algebra and convolutions ----------------------------------------------------
    def matmul(self, a, b):
        """Batched matmul with numpy broadcasting semantics over leading dims."""
        raise NotImplementedError

    def conv1d(self, x, w, stride: int, padding: int, dilation: int, groups: int):
        raise NotImplementedError

    def conv_transpose1d(self, x, w, stride, padding, output_padding, dilation, groups):
        raise NotImplementedError

    def conv2d(self, x, w, stride, padding, dilation, groups):
        raise NotImplementedError

    def conv2d_bias_act(self, x, w, bias, stride: int, padding: int, groups: int,
                        activation: str, slope: float):
        """act(conv2d(x, w) + bias[c]) for the vision nets (nn.ops.conv2d_bias_act), each step
        rounded as the separate ops round it: this composition is the reference, and a backend
        that fuses the steps keeps its bits where it can (the wasm kernels do). bias: [c_out]
        or None; activation: ACTIVATIONS."""
        out = self.conv2d(x, w, stride, padding, 1, groups)
        if bias is not None:
            out = self.binary("add", out, bias.reshape(1, -1, 1, 1))
        if activation == "relu":
            return self.unary("relu", out)
        if activation == "leaky":
            return self.binary("maximum", out, self.affine(out, slope, 0.0))
        if activation == "relu6":
            return self.clamp(out, 0.0, 6.0)
        return out

    def max_pool2d(self, x, kernel: int, stride: int, pad_end: int):
        """The max over kernel x kernel windows of [b, c, h, w], one every `stride` pixels, with
        `pad_end` rows and columns after the image repeating its edge (nn.ops.max_pool2d;
        the window fits, checked there). A max is exact: every backend gives the same values."""
        xp = self.xp
        for axis in (2, 3):
            size = x.shape[axis]
            starts = xp.arange((size + pad_end - kernel) // stride + 1) * stride
            out = None
            for offset in range(kernel):
                taken = xp.take(x, xp.minimum(starts + offset, size - 1), axis=axis)
                out = taken if out is None else xp.maximum(out, taken)
            x = out
        return x

    def resample_lines(self, x, first, band):
        """The images' resampling along one axis (io/image.resize): x [outer, lines, inner]
        uint8 or f32, first [out_lines] (intp), band [out_lines, taps] f32 ->
        f32 [outer, out_lines, inner] with out[:, i] = sum_t band[i, t] * x[:, first[i] + t]
        over the taps inside x (lines past its end are padding: zeros), summed in tap order,
        the first tap's product written and each further one added (no FMA): every backend
        gives the same bits. An output line whose first tap lies past x's end is zero."""
        raise NotImplementedError

    # -- indexing ---------------------------------------------------------------------------
    def index_select(self, x, ids, axis: int):
        raise NotImplementedError

    def gather(self, x, ids, axis: int):
        raise NotImplementedError

    def scatter_add(self, x, ids, src, axis: int):
        raise NotImplementedError

    def index_add(self, x, ids, src, axis: int):
        raise NotImplementedError

    # -- fused hot kernels (models call these through candle_web.nn.ops) --------------------
    def softmax_last_dim(self, x):
        raise NotImplementedError

    def log_softmax_last_dim(self, x):
        raise NotImplementedError

    def layer_norm(self, x, weight, bias, eps: float):
        raise NotImplementedError

    def rms_norm(self, x, weight, eps: float):
        raise NotImplementedError

    def rope(self, x, cos, sin):
        """Half-rotation RoPE on [b, h, t, d] with cos/sin [t, d/2]."""
        raise NotImplementedError

    def rope_i(self, x, cos, sin):
        """Interleaved RoPE (pairs (2i, 2i+1)) on [b, h, t, d] with cos/sin [t, d/2]."""
        raise NotImplementedError

    def silu_mul(self, gate, up):
        raise NotImplementedError

    def attention(self, q, k, v, mask, scale: float):
        """softmax(q k^T * scale + mask) v on [b, h, tq, d] x [b, h, tk, d]; mask additive."""
        raise NotImplementedError

    def qmatmul(self, x, qweight):
        """x [.., k] f32 times a quantized [n, k] weight (candle_web.quantized.QTensor)."""
        raise NotImplementedError

    def supports_qmatmul(self, ggml_dtype) -> bool:
        """Whether `qmatmul` multiplies straight from `ggml_dtype` blocks fast enough that
        QMatMul should keep such weights packed instead of dequantizing them at load."""
        return False

    # -- creation / memory ------------------------------------------------------------------
    def zeros(self, shape, np_dtype):
        raise NotImplementedError

    def full(self, shape, value, np_dtype):
        raise NotImplementedError

    def arange(self, start, end, step, np_dtype):
        raise NotImplementedError

    def contiguous(self, x):
        raise NotImplementedError

    def is_contiguous(self, x) -> bool:
        raise NotImplementedError
