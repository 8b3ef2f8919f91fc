"""The ABI of `web/vendor/kernels*.wasm`, as data: the one table of it.

`EXPORTS` names every function the kernel module exports and the kind of each argument, in
order; the constants below (op codes, matrix types, the threads build's control block, jobs,
argument blocks and memory layout, the JS module names) are the rest of what C, Python and JS
share. Nothing copies them by hand: scripts/build_kernels.py generates from this file, before
compiling, the C header the kernels include (`kernels_abi.h`: the constants, the exports'
prototypes, the control block's struct and the argument blocks' word indices) and the JS
module the page's worker imports (`web/vendor/abi.js`), and checks the built modules' exports
against `EXPORTS` (scripts/wasm_check.py); the hosts (`hosts.py`) read it to know which
arguments are arrays and which way to copy them; the wasm backend calls them.

Conventions (fixed; both sides follow them):
- The module imports its memory as `env.memory` and nothing else; it exports only `EXPORTS`.
- Pointers are i32 byte offsets into that memory; counts and strides are i32, strides in
  ELEMENTS; scalars are f32. A pointer 0 means "absent" where the argument is `optional`.
- f16 data are raw IEEE half bits (uint16); GGML blocks are the raw GGUF bytes (uint8).
- No kernel touches `__stack_pointer`; temporary storage comes from the `scratch` argument: one
  16-byte-aligned buffer of `scratch_bytes()` bytes, allocated once by the host and passed to
  every call that declares it. Callers of a host never pass `scratch` themselves: the host
  inserts it where the table says.

Argument kinds:
- IN: an array the kernel only reads; INOUT: reads and writes; OUT: only writes (not read).
- INT: an i32 (count, stride, enum); FLOAT: an f32 scalar; SCRATCH: the host's scratch buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

ABI_VERSION = 4  # 2: llama_block_step and the LLaMA layer record take qkv_b (qwen2); 3: the
# int8 products (linear_q8, quantize_q8_rows, MATRIX_INT8 in a fused step's matrix type);
# 4: the vision nets' convolutions (im2col_f32, bias_act_f32, depthwise_conv_f32) and the
# images' resampling (resample_lines_f32) and max pooling (max_pool_f32)

IN = "in"
OUT = "out"
INOUT = "inout"
INT = "int"
FLOAT = "float"
SCRATCH = "scratch"
ARRAY_KINDS = (IN, OUT, INOUT)
KINDS = (IN, OUT, INOUT, INT, FLOAT, SCRATCH)

# The module's only import: (module, name, kind).
IMPORTS = (("env", "memory", "memory"),)

# Unary op codes of `unary_f32`.
UNARY_OPS = {"gelu": 0, "gelu_erf": 1, "silu": 2, "exp": 3, "tanh": 4, "sigmoid": 5, "erf": 6}

# Activation codes of bias_act_f32 and depthwise_conv_f32 (Backend.conv2d_bias_act's names).
ACTIVATIONS = {"none": 0, "relu": 1, "leaky": 2, "relu6": 3}

# A matrix argument of the fused steps is (type, ...): these two, else a GGML type id.
MATRIX_TYPES = {"f32": 0, "f16": 1}
# Bits above a GGML type id in a fused step's matrix type (and linear_q8's `type`): the compute
# type int8 (web/kernels/linear_int8.c: int8 activations times the blocks' integer levels, bit
# for bit candle_web.quantized.int8_rows), and how numba's joined weight of a projection passed
# piece by piece groups its offsets (llama_decoder._joined: groups of the smallest size, zero
# offsets for the pieces without): the steps set those two from the pieces' types.
MATRIX_FLAGS = {"type_mask": 0xFF, "int8": 0x100, "int8_offsets_16": 0x200,
                "int8_offsets_joined": 0x400}

# The names the worker registers the instantiated modules under for Python
# (`pyodide.registerJsModule`): the kernels, and the threads build's team.
KERNELS_JS_MODULE = "candle_kernels"
TEAM_JS_MODULE = "candle_team"

# GGML type ids (candle_web.quantized.ggml_dtype.GgmlDType values) that `linear_q` implements.
LINEAR_Q_TYPES = (2, 3, 6, 7, 8, 10, 11, 12, 13, 14)  # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K


@dataclass(frozen=True)
class Arg:
    name: str
    kind: str
    dtype: str = ""  # arrays: "f32", "f16" (uint16 bits) or "u8" (GGML blocks)
    optional: bool = False  # arrays: a null pointer (None from Python) means "absent"


@dataclass(frozen=True)
class Export:
    name: str
    args: tuple
    result: str | None = None  # "i32" or None (void)
    doc: str = ""

    @property
    def array_args(self) -> tuple:
        return tuple(i for i, a in enumerate(self.args) if a.kind in ARRAY_KINDS)

    def wasm_params(self) -> tuple:
        """The wasm value types of the parameters, for checking the module's signature."""
        return tuple("f32" if a.kind == FLOAT else "i32" for a in self.args)


def _i(name):
    return Arg(name, INT)


def _f(name):
    return Arg(name, FLOAT)


def _in(name, dtype="f32", optional=False):
    return Arg(name, IN, dtype, optional)


def _out(name, dtype="f32"):
    return Arg(name, OUT, dtype)


def _inout(name, dtype="f32"):
    return Arg(name, INOUT, dtype)


_SCRATCH = Arg("scratch", SCRATCH, "u8")

EXPORTS = (
    Export("abi_version", (), "i32", "returns ABI_VERSION"),
    Export("scratch_bytes", (), "i32", "bytes of scratch any kernel may use; constant"),
    Export("gemm_f32",
           (_i("batch"), _i("m"), _i("n"), _i("k"),
            _in("a"), _i("a_bs"), _i("a_rs"), _i("a_cs"),
            _in("b"), _i("b_bs"), _i("b_rs"), _i("b_cs"),
            _inout("c"), _i("c_bs"), _i("c_rs"),
            _f("beta"), _SCRATCH),
           doc="C[b,m,n] = sum_k A[b*a_bs+m*a_rs+k*a_cs] * B[b*b_bs+k*b_rs+n*b_cs] "
               "(+ beta*C, beta 0 or 1; 0: C is not read); C[b,m,n] at b*c_bs+m*c_rs+n"),
    Export("linear_f16",
           (_i("m"), _i("n"), _i("k"), _in("x"), _i("x_rs"), _in("w", "f16"),
            _out("y"), _i("y_rs"), _SCRATCH),
           doc="Y[m,n] = sum_k X[m*x_rs+k] * half(W[n*K+k]); W contiguous [N,K] uint16"),
    Export("linear_q",
           (_i("type"), _i("m"), _i("n"), _i("k"), _in("x"), _i("x_rs"), _in("w", "u8"),
            _out("y"), _i("y_rs"), _SCRATCH),
           doc="as linear_f16 with W = N rows of K/blocksize GGML blocks of `type`"),
    Export("linear_q8",
           (_i("type"), _i("m"), _i("n"), _i("k"), _in("x"), _i("x_rs"), _in("w", "u8"),
            _out("y"), _i("y_rs"), _SCRATCH),
           doc="linear_q in int8 arithmetic (candle_web.quantized.int8_rows bit for bit); type "
               "may carry MATRIX_FLAGS' int8 bits"),
    Export("quantize_q8_rows",
           (_i("rows"), _i("k"), _in("x"), _out("q", "u8"), _out("d"), _SCRATCH),
           doc="the int8 blocks of rows x [rows, k]: q [rows, k] (int8 bytes), d [rows, k/32]"),
    Export("softmax_rows", (_i("rows"), _i("n"), _in("x"), _out("y")),
           doc="Y may equal X"),
    Export("log_softmax_rows", (_i("rows"), _i("n"), _in("x"), _out("y"))),
    Export("layer_norm_rows",
           (_i("rows"), _i("n"), _in("x"), _in("w", optional=True), _in("b", optional=True),
            _f("eps"), _out("y"))),
    Export("rms_norm_rows",
           (_i("rows"), _i("n"), _in("x"), _in("w", optional=True), _f("eps"), _out("y"))),
    Export("unary_f32", (_i("op"), _i("n"), _in("x"), _out("y")),
           doc="op: UNARY_OPS"),
    Export("silu_mul", (_i("n"), _in("g"), _in("u"), _out("y")),
           doc="Y = silu(G) * U"),
    Export("rope_f32",
           (_i("interleaved"), _i("bh"), _i("t"), _i("d"), _in("x"), _in("cos"), _in("sin"),
            _out("y")),
           doc="X,Y [bh,t,d] contiguous; COS,SIN [t,d/2]; 0: halves, 1: pairs"),
    Export("im2col_f32",
           (_i("c"), _i("h"), _i("w"), _i("kh"), _i("kw"), _i("stride"), _i("pad"),
            _i("dilation"), _in("x"), _i("cols_rs"), _inout("cols")),
           doc="X [c,h,w] -> COLS [c*kh*kw, ho*wo], rows cols_rs apart: row (ci,i,j) holds the "
               "tap's pixels, 0 in the padding (the columns between, other images', kept)"),
    Export("bias_act_f32",
           (_i("rows"), _i("n"), _in("x"), _in("bias", optional=True), _i("act"),
            _f("slope"), _out("y")),
           doc="Y[r,i] = act(X[r,i] + BIAS[r]); act: ACTIVATIONS; Y may equal X"),
    Export("depthwise_conv_f32",
           (_i("c"), _i("h"), _i("w"), _i("k"), _i("stride"), _i("pad"), _in("x"),
            _in("wts"), _in("bias", optional=True), _i("act"), _f("slope"), _out("y")),
           doc="Y[c] = act(k x k filter WTS[c] over X[c] (zero padding) + BIAS[c]); taps summed "
               "in order, no FMA (numpy's bits)"),
    Export("resample_lines_f32",
           (_i("outer"), _i("lines"), _i("inner"), _i("out_lines"), _i("taps"),
            _in("x_u8", "u8", optional=True), _in("x_f32", optional=True), _in("first", "i32"),
            _in("band"), _out("y")),
           doc="Y[o,i,:] = sum_t BAND[i,t] X[o,FIRST[i]+t,:] over taps inside X, in order, no "
               "FMA (Backend.resample_lines' bits); X uint8 or f32 (the other null)"),
    Export("max_pool_f32",
           (_i("c"), _i("h"), _i("w"), _i("k"), _i("stride"), _i("pad_end"), _in("x"),
            _out("y"), _SCRATCH),
           doc="Y[c] = max over k x k windows of X[c] every `stride` pixels, pad_end rows and "
               "columns after the image repeating its edge; w floats of scratch"),
    Export("attention_f32",
           (_i("bh"), _i("tq"), _i("tk"), _i("d"),
            _in("q"), _i("q_bs"), _in("k"), _i("k_bs"), _in("v"), _i("v_bs"),
            _in("mask", optional=True), _i("mask_bs"), _f("scale"),
            _out("o"), _i("o_bs"), _SCRATCH),
           doc="O = softmax(Q K^T * scale + MASK) V; rows of stride d; MASK [tq,tk] per "
               "batch at b*mask_bs (0: shared)"),
)


# The fused decode steps (web/kernels/steps.c, whisper_steps.c): one call per block. A matrix
# is (type, rows, pointer): type 0 f32 rows, 1 f16 bits, else a GGML type id; a projection
# stored as several tensors comes piece by piece (rows 0 and a null pointer for an absent piece).
def _matrix(name, rows=True, optional=False):
    args = [_i(f"{name}_type")]
    if rows:
        args.append(_i(f"{name}_rows"))
    args.append(_in(f"{name}_w", "any", optional=optional))
    return tuple(args)


STEP_EXPORTS = (
    Export("llama_block_step",
           (_i("d"), _i("n_heads"), _i("n_kv"), _i("head_dim"), _i("ffn"), _i("interleaved"),
            _i("pos"), _i("capacity"), _f("scale"), _inout("x"), _inout("work"),
            _in("attn_norm"), _in("mlp_norm"), _f("eps"),
            *_matrix("q"), *_matrix("k", optional=True), *_matrix("v", optional=True),
            _in("qkv_b", optional=True), *_matrix("o", rows=False), *_matrix("g"),
            *_matrix("u", optional=True),
            *_matrix("down", rows=False), _inout("keys"), _inout("values"), _in("cos"),
            _in("sin"), _SCRATCH),
           doc="one LLaMA block, batch 1: x [d] in place; writes keys/values [n_kv, capacity, "
               "head_dim] at pos; qkv_b: the bias on q|k|v (qwen2) or null; work d + (q + 2kv) "
               "+ q + 3 ffn floats"),
    Export("rms_logits_step",
           (_i("d"), _i("rows"), _in("x"), _in("norm"), _f("eps"), *_matrix("w", rows=False),
            _inout("work"), _out("logits"), _SCRATCH),
           doc="logits [rows] = W rms_norm(x); work d floats"),
    Export("whisper_block_step",
           (_i("r"), _i("d"), _i("n_head"), _i("ffn"), _i("pos"), _i("capacity"), _i("n_audio"),
            _f("eps"), _f("scale"), _inout("x"), _inout("work"),
            _in("ln1_w"), _in("ln1_b"), *_matrix("qkv", rows=False), _in("qkv_b"),
            *_matrix("out", rows=False), _in("out_b"),
            _in("ln2_w"), _in("ln2_b"), *_matrix("cq", rows=False), _in("cq_b"),
            _in("cross_k"), _in("cross_v"), _i("cross_bs"),
            *_matrix("co", rows=False), _in("co_b"),
            _in("ln3_w"), _in("ln3_b"), *_matrix("fc1", rows=False), _in("fc1_b"),
            *_matrix("fc2", rows=False), _in("fc2_b"), _inout("keys"), _inout("values"),
            _SCRATCH),
           doc="one Whisper decoder block for R rows: x [R, d] in place; writes keys/values "
               "[R, h, capacity, dh] at pos; cross K/V [h, n_audio, dh] per audio row at "
               "r * cross_bs; work R * (6d + ffn) floats"),
    Export("ln_logits_step",
           (_i("r"), _i("d"), _i("rows"), _in("x"), _in("ln_w"), _in("ln_b"), _f("eps"),
            *_matrix("w", rows=False), _inout("work"), _out("logits"), _SCRATCH),
           doc="logits [R, rows] = W layer_norm(x); work R * d floats"),
)
EXPORTS = EXPORTS + STEP_EXPORTS

EXPORTS_BY_NAME = {e.name: e for e in EXPORTS}
EXPORT_NAMES = tuple(e.name for e in EXPORTS)


# -- the threads build (web/vendor/kernels-threads.wasm; web/kernels/team.h) ----------------------
# It imports a SHARED memory as env.memory (not Pyodide's: that one cannot be shared) and runs
# whole decode steps on two threads: the host keeps the weights resident in that memory, a
# helper worker sits in team_worker, and the caller's team_run returns when the step is done.
# Every argument is an i32 offset into the shared memory (the argument block: i32 words, f32
# scalars as their bits) or an i32 number.
TEAM_CTRL_BYTES = 32  # the control block (TeamCtrl), 16-byte aligned, zeroed
TEAM_CTRL_FIELDS = ("generation", "job", "args", "nthreads", "alive", "count", "sense",
                    "jobs_done")  # int32 each, in this order
TEAM_CTRL_NOTES = {
    "generation": "bumped by team_run for every job; the helper waits on it",
    "job": "TEAM_JOB_*",
    "args": "the job's argument block (i32 words; f32 as bits)",
    "nthreads": "of this job: 2, or 1 when the helper is not there",
    "alive": "1 while a helper is inside team_worker",
    "count": "barrier arrivals",
    "sense": "barrier phase, flipped by the last arrival",
    "jobs_done": "jobs the helper took part in (for tests and the page's footer)",
}
# Fixed places in the shared memory (the worker makes it and tells Python them in `layout`):
# nothing below 1 MiB (the null pointer, wasm-ld's unused stack region), the control block,
# the helper thread's scratch, then the hosts' arena. The memory's maximum is the threads
# build's declared one (the linker's --max-memory).
TEAM_CTRL_OFFSET = 1 << 20
TEAM_HELPER_SCRATCH_OFFSET = TEAM_CTRL_OFFSET + 64
TEAM_MAX_BYTES = 1 << 31
WASM_PAGE_BYTES = 1 << 16
TEAM_JOBS = {"stop": 0, "llama_step": 1, "whisper_step": 2, "whisper_encoder": 3}

TEAM_EXPORTS = (
    Export("abi_version", (), "i32", "returns ABI_VERSION"),
    Export("scratch_bytes", (), "i32", "bytes of scratch each thread needs; constant"),
    Export("team_run", (_i("ctrl"), _i("job"), _i("args"), _i("scratch")), "i32",
           doc="runs job (TEAM_JOBS) on its argument block, with the helper when it is in "
               "team_worker; returns the number of threads that ran it"),
    Export("team_worker", (_i("ctrl"), _i("scratch")),
           doc="the helper thread's loop; returns only after a `stop` job"),
)
TEAM_EXPORT_NAMES = tuple(e.name for e in TEAM_EXPORTS)

# The argument blocks: a header, then one record per block. Each entry is (name, kind) with
# kind "i" (i32), "f" (f32 bits) or "p" (pointer into the shared memory, 0: absent). The C
# side (steps.c: llama_team_step; whisper_steps.c: whisper_team_step,
# whisper_encoder_team_step) reads each word by the index the generated header names after it
# (TEAM_LLAMA_LAYER_Q_TYPE, ...).
# The LLaMA job's `work` is llama_block_step's (d + (q + 2 kv) + q + 3 ffn floats) and then d
# floats for each thread after the first (its own rms_norm output).
TEAM_LLAMA_HEADER = (
    ("d", "i"), ("n_heads", "i"), ("n_kv", "i"), ("head_dim", "i"), ("ffn", "i"),
    ("interleaved", "i"), ("pos", "i"), ("scale", "f"), ("n_layers", "i"),
    ("layer_words", "i"), ("x", "p"), ("work", "p"), ("cos_row", "p"), ("sin_row", "p"),
    ("kv_out", "p"), ("norm", "p"), ("norm_eps", "f"), ("head_type", "i"), ("vocab", "i"),
    ("logits", "p"), ("head_w", "p"))
TEAM_LLAMA_LAYER = (
    ("capacity", "i"), ("attn_norm", "p"), ("mlp_norm", "p"), ("eps", "f"),
    ("q_type", "i"), ("q_rows", "i"), ("q_w", "p"), ("k_type", "i"), ("k_rows", "i"),
    ("k_w", "p"), ("v_type", "i"), ("v_rows", "i"), ("v_w", "p"), ("qkv_b", "p"),
    ("o_type", "i"), ("o_w", "p"), ("g_type", "i"), ("g_rows", "i"), ("g_w", "p"),
    ("u_type", "i"), ("u_rows", "i"), ("u_w", "p"), ("down_type", "i"), ("down_w", "p"),
    ("keys", "p"), ("values", "p"))
TEAM_WHISPER_HEADER = (
    ("r", "i"), ("d", "i"), ("n_head", "i"), ("ffn", "i"), ("pos", "i"), ("n_audio", "i"),
    ("eps", "f"), ("scale", "f"), ("n_blocks", "i"), ("block_words", "i"), ("x", "p"),
    ("work", "p"), ("cross_bs", "i"), ("kv_out", "p"), ("ln_w", "p"), ("ln_b", "p"),
    ("head_type", "i"), ("head_w", "p"), ("vocab", "i"), ("logits", "p"), ("ln_eps", "f"))
TEAM_WHISPER_BLOCK = (
    ("capacity", "i"), ("ln1_w", "p"), ("ln1_b", "p"), ("qkv_type", "i"), ("qkv_w", "p"),
    ("qkv_b", "p"), ("out_type", "i"), ("out_w", "p"), ("out_b", "p"), ("ln2_w", "p"),
    ("ln2_b", "p"), ("cq_type", "i"), ("cq_w", "p"), ("cq_b", "p"), ("cross_k", "p"),
    ("cross_v", "p"), ("co_type", "i"), ("co_w", "p"), ("co_b", "p"), ("ln3_w", "p"),
    ("ln3_b", "p"), ("fc1_type", "i"), ("fc1_w", "p"), ("fc1_b", "p"), ("fc2_type", "i"),
    ("fc2_w", "p"), ("fc2_b", "p"), ("keys", "p"), ("values", "p"))

# The encoder job: one audio window, mel time-major with a zero row before and after.
TEAM_ENCODER_HEADER = (
    ("frames_in", "i"), ("n_mels", "i"), ("d", "i"), ("n_head", "i"), ("ffn", "i"),
    ("n_blocks", "i"), ("block_words", "i"), ("mel", "p"), ("conv1_w", "p"), ("conv1_b", "p"),
    ("conv2_w", "p"), ("conv2_b", "p"), ("positions", "p"), ("ln_w", "p"), ("ln_b", "p"),
    ("ln_eps", "f"), ("scale", "f"), ("out", "p"), ("work", "p"))
TEAM_ENCODER_BLOCK = (
    ("ln1_w", "p"), ("ln1_b", "p"), ("qkv_w", "p"), ("qkv_b", "p"), ("out_w", "p"),
    ("out_b", "p"), ("ln2_w", "p"), ("ln2_b", "p"), ("fc1_w", "p"), ("fc1_b", "p"),
    ("fc2_w", "p"), ("fc2_b", "p"), ("ln1_eps", "f"), ("ln2_eps", "f"))


def team_encoder_work_floats(frames_in: int, d: int, ffn: int) -> int:
    """Floats of the encoder job's activations (whisper_steps.c: whisper_encoder_team_step)."""
    frames = (frames_in - 1) // 2 + 1
    return (frames_in + 2) * d + frames * d * 10 + frames * ffn


# The argument blocks by the name the generated header gives their sizes (in words) and the
# prefix of their fields' indices.
TEAM_ARG_BLOCKS = {
    "TEAM_LLAMA_HEADER": TEAM_LLAMA_HEADER, "TEAM_LLAMA_LAYER": TEAM_LLAMA_LAYER,
    "TEAM_WHISPER_HEADER": TEAM_WHISPER_HEADER, "TEAM_WHISPER_BLOCK": TEAM_WHISPER_BLOCK,
    "TEAM_ENCODER_HEADER": TEAM_ENCODER_HEADER, "TEAM_ENCODER_BLOCK": TEAM_ENCODER_BLOCK,
}
