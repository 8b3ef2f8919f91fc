"""The wasm backend: the browser's twin of numba, calling the WebAssembly SIMD kernels of
`web/kernels/` (`kernels.wasm`) through a host (`hosts.py`).

It is the numpy reference with the hot ops overridden: f32 matmul (batched, broadcast, any
strided or transposed 2-D views passed as strides, not copied), softmax / log-softmax over the
last dim, layer and RMS norm, RoPE (both layouts), SiLU-and-multiply, the unary activations the
module has (gelu, gelu_erf, silu, exp, tanh, sigmoid, erf), attention (blocked over keys; a KV
cache's capacity is just a batch stride) and quantized matmul straight from GGML blocks (so
QMatMul keeps them packed). Everything else, and every case a kernel does not cover (f64,
integers, shapes the ABI cannot express), runs through NumpyBackend unchanged.

The same code runs in the page (`PyodideHost`: arrays in place) and natively under wasmtime
(`WasmtimeHost`: copies), which is how the tests check it against numpy.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np

from ...core.errors import BackendUnavailable
from ..numpy_backend import NumpyBackend
from . import abi
from .hosts import JS_MODULE_NAME, PyodideHost, WasmtimeHost, pyodide_js_module

_F32 = np.dtype(np.float32)
_F16_TYPE = 1  # GgmlDType.F16: linear_f16 multiplies from raw half bits
KERNELS_FILE = "kernels.wasm"


def _elements(a: np.ndarray):
    """a's strides in elements, or None when one is negative or not a whole element."""
    size = a.itemsize
    out = []
    for s in a.strides:
        if s < 0 or s % size:
            return None
        out.append(s // size)
    return out


def _strided_f32(a: np.ndarray):
    """(a, element strides) with a copied to C order only when its strides cannot be passed."""
    strides = _elements(a)
    if strides is None:
        a = np.ascontiguousarray(a)
        strides = _elements(a)
    return a, strides


def _collapse(shape, strides):
    """The one stride that walks dims `shape` (row-major) as a single index, or None when no
    single stride does (size-1 dims never matter)."""
    stride = None
    expected = None
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 1:
            continue
        if stride is None:
            stride = s
        elif s != expected:
            return None
        expected = s * n
    return 0 if stride is None else stride


def _split(batch, operands):
    """The fewest leading batch dims to loop over in Python so that the remaining ones
    collapse to a single stride in every operand (a list of per-dim element-stride lists
    over `batch`). Returns (p, [stride per operand])."""
    for p in range(len(batch) + 1):
        inner = batch[p:]
        strides = [_collapse(inner, s[p:]) for s in operands]
        if all(s is not None for s in strides):
            return p, strides
    raise AssertionError("an empty batch always collapses")


def _rows(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous array (a copy only when it is not)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class WasmBackend(NumpyBackend):
    name = "wasm"

    def __init__(self, host):
        # Not NumpyBackend.__init__: no scipy sgemm (its import costs seconds in the page and
        # every f32 matmul goes to the kernels; f64 uses numpy's own matmul).
        self._sgemm = None
        self.host = host
        # The exports as functions, looked up once (a call in the page costs microseconds).
        self._k = {name: host.kernel(name) for name in abi.EXPORT_NAMES}
        self._q_types = frozenset(abi.LINEAR_Q_TYPES)
        self.team = None  # the threads build's host (attach_team), for two-thread decode steps

    def attach_team(self, team) -> None:
        """Decode-step parts built from now on run on `team` (a team.py host: two threads,
        the weights resident in its shared memory); None detaches it. Parts already built keep
        what they run on."""
        self.team = team

    def team_part(self, cls, weights):
        """The two-thread version of parts.py's part `cls` for these weights, or None (no
        team attached, no such version, or the weights do not fit it)."""
        if self.team is None:
            return None
        from . import team_parts

        return team_parts.build(self, cls, weights)

    def __repr__(self):
        return f"WasmBackend({getattr(self.host, 'kind', type(self.host).__name__)})"

    # -- elementwise ------------------------------------------------------------------------
    def unary(self, op, x):
        code = abi.UNARY_OPS.get(op)
        if code is None or x.dtype != _F32 or x.size == 0:
            return super().unary(op, x)
        x = _rows(x)
        out = np.empty_like(x)
        self._k["unary_f32"](code, x.size, x, out)
        return out

    def silu_mul(self, gate, up):
        if gate.dtype != _F32 or up.dtype != _F32 or gate.shape != up.shape or gate.size == 0:
            return super().silu_mul(gate, up)
        gate = _rows(gate)
        up = _rows(up)
        out = np.empty_like(gate)
        self._k["silu_mul"](gate.size, gate, up, out)
        return out

    # -- matmul -----------------------------------------------------------------------------
    def matmul(self, a, b):
        if a.dtype != _F32 or b.dtype != _F32 or a.ndim < 2 or b.ndim < 2:
            return super().matmul(a, b)
        m, k = a.shape[-2:]
        k_b, n = b.shape[-2:]
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return super().matmul(a, b)  # numpy's own error
        if k != k_b or m == 0 or n == 0 or k == 0 or 0 in batch:
            return super().matmul(a, b)
        a, a_el = _strided_f32(a)
        b, b_el = _strided_f32(b)
        gemm = self._k["gemm_f32"]
        if not batch:  # the common case, without broadcast views (they cost in the page)
            out = np.empty((m, n), np.float32)
            gemm(1, m, n, k, a, 0, a_el[0], a_el[1], b, 0, b_el[0], b_el[1],
                 out, 0, n, 0.0)
            return out
        a_full = np.broadcast_to(a, batch + (m, k))
        b_full = np.broadcast_to(b, batch + (k, n))
        out = np.empty(batch + (m, n), np.float32)
        nb = len(batch)
        a_el = _elements(a_full)
        b_el = _elements(b_full)
        a_rs, a_cs = a_el[nb:]
        b_rs, b_cs = b_el[nb:]
        p, (a_bs, b_bs, c_bs) = _split(batch, [a_el[:nb], b_el[:nb], _elements(out)[:nb]])
        inner = math.prod(batch[p:])
        if p == 0:
            gemm(inner, m, n, k, a_full, a_bs, a_rs, a_cs, b_full, b_bs, b_rs, b_cs,
                 out, c_bs, n, 0.0)
            return out
        for index in np.ndindex(*batch[:p]):
            gemm(inner, m, n, k, a_full[index], a_bs, a_rs, a_cs, b_full[index],
                 b_bs, b_rs, b_cs, out[index], c_bs, n, 0.0)
        return out

    # -- the vision nets' convolutions --------------------------------------------------------
    def conv2d_bias_act(self, x, w, bias, stride, padding, groups, activation, slope):
        """Depthwise filters (one per channel, square) in one kernel with the bias and the
        activation (numpy's bits); other ungrouped convolutions as im2col_f32 (a 1x1 stride-1
        filter reads the map as it lies), one GEMM for the whole batch (its images side by
        side in the columns: a deep layer's 4x4 map alone made N = 16), and bias_act_f32 in
        place. The rest: Backend's composition."""
        act = abi.ACTIVATIONS.get(activation)
        batch, c_in, height, width = x.shape
        c_out, c_in_group, k_h, k_w = w.shape
        if (act is None or x.dtype != _F32 or w.dtype != _F32 or x.size == 0
                or (bias is not None and bias.dtype != _F32)):
            return super().conv2d_bias_act(x, w, bias, stride, padding, groups, activation, slope)
        h_out = (height + 2 * padding - k_h) // stride + 1
        w_out = (width + 2 * padding - k_w) // stride + 1
        x = _rows(x)
        bias = None if bias is None else _rows(bias)
        out = np.empty((batch, c_out, h_out, w_out), np.float32)
        if groups == c_in == c_out and c_in_group == 1 and k_h == k_w:
            filters = _rows(w.reshape(c_out, k_h * k_w))
            for b in range(batch):
                self._k["depthwise_conv_f32"](c_in, height, width, k_h, stride, padding, x[b],
                                              filters, bias, act, slope, out[b])
            return out
        if groups != 1:
            return super().conv2d_bias_act(x, w, bias, stride, padding, groups, activation, slope)
        k = c_in * k_h * k_w
        hw = h_out * w_out
        columns = batch * hw
        weights, w_el = _strided_f32(w.reshape(c_out, k))
        if k_h == k_w == 1 and stride == 1 and padding == 0:
            cols = x.reshape(c_in, hw) if batch == 1 else np.ascontiguousarray(
                x.reshape(batch, c_in, hw).transpose(1, 0, 2)).reshape(c_in, columns)
        else:
            cols = np.empty((k, columns), np.float32)
            flat = cols.reshape(-1)
            for b in range(batch):
                self._k["im2col_f32"](c_in, height, width, k_h, k_w, stride, padding, 1, x[b],
                                      columns, flat[b * hw:])
        target = out.reshape(c_out, hw) if batch == 1 else np.empty((c_out, columns), np.float32)
        self._k["gemm_f32"](1, c_out, columns, k, weights, 0, w_el[0], w_el[1], cols, 0,
                            columns, 1, target, 0, columns, 0.0)
        self._k["bias_act_f32"](c_out, columns, target, bias, act, slope, target)
        if batch > 1:
            out[:] = target.reshape(c_out, batch, h_out, w_out).transpose(1, 0, 2, 3)
        return out

    def max_pool2d(self, x, kernel, stride, pad_end):
        if (x.dtype != _F32 or x.ndim != 4 or x.size == 0
                or 4 * x.shape[3] > self.host.scratch_bytes):  # a row of maxima in scratch
            return super().max_pool2d(x, kernel, stride, pad_end)
        batch, channels, height, width = x.shape
        x = _rows(x)
        out = np.empty((batch, channels, (height + pad_end - kernel) // stride + 1,
                        (width + pad_end - kernel) // stride + 1), np.float32)
        self._k["max_pool_f32"](batch * channels, height, width, kernel, stride, pad_end, x, out)
        return out

    def resample_lines(self, x, first, band):
        if x.dtype not in (np.uint8, _F32) or band.dtype != _F32 or x.size == 0:
            return super().resample_lines(x, first, band)
        outer, lines, inner = x.shape
        out_lines, taps = band.shape
        x = _rows(x)
        out = np.empty((outer, out_lines, inner), np.float32)
        u8 = x.dtype == np.uint8
        self._k["resample_lines_f32"](outer, lines, inner, out_lines, taps, x if u8 else None,
                                      None if u8 else x, _rows(first.astype(np.int32)),
                                      _rows(band), out)
        return out

    # -- fused kernels ----------------------------------------------------------------------
    def _rowwise(self, export, x, *extra):
        x = _rows(x)
        out = np.empty_like(x)
        n = x.shape[-1]
        self._k[export](x.size // n, n, x, *extra, out)
        return out

    def softmax_last_dim(self, x):
        if x.dtype != _F32 or x.ndim == 0 or x.size == 0:
            return super().softmax_last_dim(x)
        return self._rowwise("softmax_rows", x)

    def log_softmax_last_dim(self, x):
        if x.dtype != _F32 or x.ndim == 0 or x.size == 0:
            return super().log_softmax_last_dim(x)
        return self._rowwise("log_softmax_rows", x)

    @staticmethod
    def _row_vector(w, n):
        """A norm's weight/bias as a contiguous f32 [n], None for absent, False when the kernel
        cannot take it (numpy then broadcasts it)."""
        if w is None:
            return None
        if w.dtype != _F32 or w.shape != (n,):
            return False
        return _rows(w)

    def layer_norm(self, x, weight, bias, eps):
        if x.dtype == _F32 and x.ndim and x.size:
            n = x.shape[-1]
            w = self._row_vector(weight, n)
            b = self._row_vector(bias, n)
            if w is not False and b is not False:
                x = _rows(x)
                out = np.empty_like(x)
                self._k["layer_norm_rows"](x.size // n, n, x, w, b, float(eps), out)
                return out
        return super().layer_norm(x, weight, bias, eps)

    def rms_norm(self, x, weight, eps):
        if x.dtype == _F32 and x.ndim and x.size:
            n = x.shape[-1]
            w = self._row_vector(weight, n)
            if w is not False:
                x = _rows(x)
                out = np.empty_like(x)
                self._k["rms_norm_rows"](x.size // n, n, x, w, float(eps), out)
                return out
        return super().rms_norm(x, weight, eps)

    def _rope(self, x, cos, sin, interleaved):
        if x.dtype != _F32 or cos.dtype != _F32 or sin.dtype != _F32 or x.ndim != 4 or \
                x.size == 0:
            return None
        t, d = x.shape[2:]
        if d % 2 or cos.shape != (t, d // 2) or sin.shape != (t, d // 2):
            return None
        x = _rows(x)
        out = np.empty_like(x)
        self._k["rope_f32"](interleaved, x.shape[0] * x.shape[1], t, d, x, _rows(cos),
                   _rows(sin), out)
        return out

    def rope(self, x, cos, sin):
        out = self._rope(x, cos, sin, 0)
        return super().rope(x, cos, sin) if out is None else out

    def rope_i(self, x, cos, sin):
        out = self._rope(x, cos, sin, 1)
        return super().rope_i(x, cos, sin) if out is None else out

    def attention(self, q, k, v, mask, scale):
        out = self._attention(q, k, v, mask, scale)
        return super().attention(q, k, v, mask, scale) if out is None else out

    def _attention(self, q, k, v, mask, scale):
        if q.dtype != _F32 or k.dtype != _F32 or v.dtype != _F32 or \
                (mask is not None and mask.dtype != _F32):
            return None
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            return None
        tq, d = q.shape[2:]
        tk = k.shape[2]
        if k.shape[3] != d or v.shape[2:] != (tk, d):
            return None  # v's width must equal d (the ABI's row stride)
        try:
            batch = np.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
            if mask is not None:
                np.broadcast_shapes(mask.shape, batch + (tq, tk))
        except ValueError:
            return None  # numpy reports it
        if 0 in batch or tq == 0 or tk == 0 or d == 0:
            return None
        rows = []
        for x, t in ((q, tq), (k, tk), (v, tk)):
            full = np.broadcast_to(x, batch + (t, d))
            el = _elements(full)
            if el is None or (d > 1 and el[3] != 1) or (t > 1 and el[2] != d):
                full = np.broadcast_to(np.ascontiguousarray(x), batch + (t, d))
                el = _elements(full)
            rows.append((full, el[:2]))
        if mask is not None:
            m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape) if mask.ndim < 4 else mask
            full = np.broadcast_to(m4, batch + (tq, tk))
            el = _elements(full)
            if el is None or (tk > 1 and el[3] != 1) or (tq > 1 and el[2] != tk):
                # the kernel reads [tq, tk] rows: expand a broadcast row or column once
                own = np.ascontiguousarray(np.broadcast_to(m4, m4.shape[:2] + (tq, tk)))
                full = np.broadcast_to(own, batch + (tq, tk))
                el = _elements(full)
            rows.append((full, el[:2]))
        out = np.empty(batch + (tq, d), np.float32)
        p, strides = _split(batch, [el for _, el in rows] + [_elements(out)[:2]])
        inner = math.prod(batch[p:])
        q_bs, k_bs, v_bs = strides[:3]
        m_bs = strides[3] if mask is not None else 0
        o_bs = strides[-1]
        scale = float(scale)
        for index in np.ndindex(*batch[:p]):
            qf, kf, vf = (r[0][index] for r in rows[:3])
            mf = rows[3][0][index] if mask is not None else None
            self._k["attention_f32"](inner, tq, tk, d, qf, q_bs, kf, k_bs, vf, v_bs, mf,
                       m_bs, scale, out[index], o_bs)
        return out

    # -- quantized matmul -------------------------------------------------------------------
    def supports_qmatmul(self, ggml_dtype) -> bool:
        return int(ggml_dtype) in self._q_types

    def qmatmul(self, x, qweight):
        kind = int(qweight.dtype)
        if len(qweight.shape) != 2 or (kind not in self._q_types and kind != _F16_TYPE):
            return super().qmatmul(x, qweight)
        n, k = qweight.shape
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[-1] != k or x.size == 0 or n == 0:
            return super().qmatmul(x, qweight)  # numpy's error, or an empty result
        if x.dtype != _F32:
            x = x.astype(np.float32)
        flat = x.reshape(-1, k)
        if flat.strides[1] != 4 or flat.strides[0] % 4 or flat.strides[0] < 0:
            flat = np.ascontiguousarray(flat)
        m = flat.shape[0]
        x_rs = flat.strides[0] // 4 if m > 1 else k
        out = np.empty((m, n), np.float32)
        if kind == _F16_TYPE:
            self._k["linear_f16"](m, n, k, flat, x_rs, qweight.data.view(np.uint16), out, n)
        elif int8_products():
            # the compute type int8: every row quantized alone, so a prompt's rows get the bits
            # the fused decode step gives each token (linear_int8.c)
            self._k["linear_q8"](kind | abi.MATRIX_FLAGS["int8"], m, n, k, flat, x_rs,
                                 qweight.data, out, n)
        else:
            self._k["linear_q"](kind, m, n, k, flat, x_rs, qweight.data, out, n)
        return out.reshape(x.shape[:-1] + (n,))


def int8_products() -> bool:
    """Whether GGML blocks are multiplied in int8 arithmetic (settings().compute_type, which
    the page sets from ?compute=): linear_q8 instead of linear_q, here and in the fused steps
    (parts.py)."""
    from ..settings import settings

    return settings().compute_type == "int8"


# -- the factory ------------------------------------------------------------------------------

def default_kernels_path() -> Path | None:
    """web/vendor/kernels.wasm of the source checkout this package runs from (pkg/candle_web/
    backend/wasm/ -> the checkout), or None for an installed package."""
    checkout = Path(__file__).resolve().parents[4]
    candidate = checkout / "web" / "vendor" / KERNELS_FILE
    if (checkout / "pyproject.toml").is_file() and candidate.is_file():
        return candidate
    return None


def _missing_page_module() -> BackendUnavailable:
    return BackendUnavailable(
        f"no kernels: the worker has not registered the JS module {JS_MODULE_NAME!r} (it does "
        "after instantiating kernels.wasm)")


def install(js_module=None, make_default: bool = True) -> WasmBackend:
    """In the page: the "wasm" backend on the kernels the worker registered as `candle_kernels`
    (or on `js_module`, which replaces the backend the registry holds), made `Device.cpu()`'s
    backend unless `make_default` is False (a settings override, cpu_backend="wasm"). Call it
    before the first tensor op. See hosts.py's module doc."""
    from .. import get_backend, set_backend
    from ..settings import override_settings

    if js_module is not None:
        backend = WasmBackend(PyodideHost(js_module))
        set_backend("wasm", backend)
    elif pyodide_js_module() is None:
        raise _missing_page_module()
    else:
        backend = get_backend("wasm")  # in Pyodide the factory builds it on that module, once
    if make_default:
        override_settings(cpu_backend="wasm")
    return backend


def create_backend() -> WasmBackend:
    """The "wasm" backend's factory (the registry in backend/__init__ calls it once and keeps
    the backend): in Pyodide on the kernels the worker registered; natively under wasmtime on
    CANDLE_WEB_WASM_KERNELS (default: the checkout's web/vendor/kernels.wasm)."""
    from ..settings import WASM_KERNELS_VARIABLE, settings

    if sys.platform == "emscripten":
        module = pyodide_js_module()
        if module is None:
            raise _missing_page_module()
        return WasmBackend(PyodideHost(module))
    configured = settings().wasm_kernels
    path = Path(configured) if configured else default_kernels_path()
    if path is None:
        raise BackendUnavailable(
            f"no kernel module: no web/vendor/{KERNELS_FILE} in a source checkout around this "
            f"package and {WASM_KERNELS_VARIABLE} is not set (build it: scripts/build_kernels.py)")
    if not path.is_file():
        raise BackendUnavailable(f"no kernel module: {path} does not exist "
                                 f"({WASM_KERNELS_VARIABLE}; build it: scripts/build_kernels.py)")
    try:
        import wasmtime  # noqa: F401  (the dev extra)
    except ImportError:
        raise BackendUnavailable("natively the kernels run under wasmtime, which is not "
                                 "installed: pip install 'candle-web[dev]'") from None
    return WasmBackend(WasmtimeHost(os.fspath(path)))
