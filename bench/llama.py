"""SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct text generation speed: candle-web
(numpy and numba backends) next to PyTorch eager (transformers) and llama.cpp, in one script.

    .venv/bin/python bench/llama.py [--quants Q4_1,Q8_0,Q4_0,F32,qwen] [--prompt-tokens 128]
                                    [--decode-tokens 64] [--threads 2] [--repeat 1]
                                    [--backends numpy,numba] [--compute-types float32,int8]
                                    [--no-torch] [--no-llama-cpp]

Models: the real Q4_1 GGUF; Q8_0 and Q4_0 GGUFs re-quantized (QTensor.from_float) from its
dequantized weights and written to a temp folder; F32: the dequantized weights as an HF
safetensors checkpoint (tests/reference/record_llama.py builds it), which is also what PyTorch
runs. qwen: the registry's Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF as published (Q5_0, Q8_0,
Q4_K, Q6_K; QKV bias), with its own tokenizer for the prompt; it has no PyTorch row (the
PyTorch peer is SmolLM2's F32 model; transformers would run it dequantized to 2 GB of f32).
llama.cpp runs the very same GGUF files (F32 as a float GGUF): in process through
llama-cpp-python when importable, else as llama.cpp's own `llama-bench` (built by
scripts/build_llama_cpp.sh, which `make bench` runs; $LLAMA_BENCH names another binary), run
in each model's rounds: prompt at depth 0, decode of --decode-tokens at depth --prompt-tokens
(after a prompt of that length, as the other engines decode). llama-bench gives no token ids.

The numba backend runs once per compute type (--compute-types): cw-numba multiplies the
quantized weights widened to f32, cw-numba-int8 int8 activations by the int8 levels with integer
dot products (CANDLE_WEB_COMPUTE_TYPE=int8); their `ids` column says where int8's greedy ids
leave the float path's.
For each model and engine: prompt processing tok/s (one forward over a `--prompt-tokens`
prompt) and decode tok/s (`--decode-tokens` greedy steps with the KV cache, argmax done by
each engine's caller in numpy), medians over `--repeat` rounds; engines run interleaved round
by round so machine load hits them alike. PyTorch (its one f32 model) is measured again in
every model's rounds; ratios are decode tok/s over PyTorch's and over llama.cpp's (same file)
from the same rounds. `ids`: whether the engine's greedy ids equal candle-web numpy's on the
same model (for PyTorch, on that model's quantization, so only F32 is expected to agree),
else the first step where they differ.
`--threads` sets BLAS, OpenMP, numba and torch threads alike before any of them is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO)]

MODEL = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN = "qwen"  # the --quants name of the Qwen2.5 file
QWEN_MODEL = "qwen2.5-coder-0.5b-instruct"
QWEN_GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMBA_NUM_THREADS")
QUANTS = ("Q4_1", "Q8_0", "Q4_0", "F32", QWEN)
# Text repeated until the prompt has the requested number of tokens.
PROMPT_TEXT = ("The history of the printing press begins in the fifteenth century, when "
               "movable type changed how books were made, sold and read across Europe. ")
LLAMA_CPP_CONTEXT = 512
LLAMA_BENCH_VARIABLE = "LLAMA_BENCH"
LLAMA_BENCH_DEFAULT = Path("~/.cache/candle-web/llama.cpp/bin/llama-bench").expanduser()


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def argmax(logits) -> int:
    import numpy as np

    return int(np.argmax(np.asarray(logits).reshape(-1)))


# -- model files ----------------------------------------------------------------------------
def _requantized_gguf(source, target: str, path: Path) -> Path:
    """`source` (a GgufFile) with every 2-D weight re-quantized to `target` from its
    dequantized values; 1-D norm weights stay F32. Metadata (tokenizer included) is kept."""
    import numpy as np

    from candle_web.io.gguf import write_gguf
    from candle_web.quantized.qtensor import QTensor

    tensors = {}
    for name in source.tensors:
        values = source.qtensor(name).dequantize()
        if values.ndim == 2 and target != "F32":
            tensors[name] = QTensor.from_float(values, target)
        else:
            tensors[name] = np.ascontiguousarray(values, dtype=np.float32)
    write_gguf(path, source.metadata, tensors, metadata_types=source.metadata_types)
    return path


def prepare_models(quants, work: Path) -> dict:
    """{quant: {"gguf": path, "hf": folder (F32 only)}} for the requested quants (QWEN: the
    Qwen2.5 file itself)."""
    from tests.reference.record_llama import read_with_candle_web, write_hf_checkpoint

    from candle_web import hub
    from candle_web.io.gguf import GgufFile

    original = hub.fetch(MODEL, GGUF_NAME)
    source = GgufFile(original)
    models = {}
    for quant in quants:
        started = time.perf_counter()
        if quant == "Q4_1":
            models[quant] = {"gguf": original}
        elif quant == QWEN:
            models[quant] = {"gguf": hub.fetch(QWEN_MODEL, QWEN_GGUF_NAME)}
        else:
            models[quant] = {"gguf": _requantized_gguf(source, quant, work / f"{quant}.gguf")}
        if quant == "F32":
            metadata, tensors = read_with_candle_web(original)
            write_hf_checkpoint(metadata, tensors, work / "hf")
            models[quant]["hf"] = work / "hf"
        print(f"  prepared {quant} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return models


# -- engines: reset(), prefill(ids) -> last logits, step(id) -> logits ------------------------
class CandleEngine:
    def __init__(self, backend: str, model_path: Path, compute_type: str = "float32"):
        from candle_web import Device
        from candle_web.backend import parts
        from candle_web.backend.settings import override_settings, reload_settings
        from candle_web.models.llama import Llama

        self.name = f"cw-{backend}" + ("" if compute_type == "float32" else f"-{compute_type}")
        started = time.perf_counter()
        # The compute type is read where the fused part builds its weights: at the first step.
        override_settings(compute_type=compute_type)
        try:
            self.model = Llama.from_pretrained(model_path, device=Device.cpu(backend=backend))
            # as the decode loop runs it: a backend's fused step for single tokens where it has one
            self.steps = parts.start_causal_decoding(self.model)
            self.steps([[0]], 0)
        finally:
            reload_settings()
        self.load_s = time.perf_counter() - started

    def reset(self, capacity: int):
        self.model.clear_kv_cache(capacity)

    def prefill(self, ids):
        return self.steps([ids], 0).to_numpy()[0]

    def step(self, token: int):
        return self.steps([[token]], self.model.seq_len).to_numpy()[0]


class TorchEngine:
    name = "torch"

    def __init__(self, folder: Path, threads: int):
        import torch
        from transformers import LlamaForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        started = time.perf_counter()
        self.model = LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32,
                                                      attn_implementation="eager").eval()
        self.load_s = time.perf_counter() - started
        self.past = None

    def reset(self, capacity: int):
        self.past = None

    def _run(self, ids):
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([ids]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].numpy()

    def prefill(self, ids):
        return self._run(ids)

    def step(self, token: int):
        return self._run([token])


class LlamaCppEngine:
    name = "llama.cpp"

    def __init__(self, gguf: Path, threads: int):
        import llama_cpp

        started = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=LLAMA_CPP_CONTEXT,
                                   n_threads=threads, n_threads_batch=threads, n_batch=512,
                                   logits_all=False, verbose=False)
        self.load_s = time.perf_counter() - started

    def reset(self, capacity: int):
        self.llm.reset()

    def _last_logits(self):
        return self.llm.scores[self.llm.n_tokens - 1]

    def prefill(self, ids):
        self.llm.eval(list(ids))
        return self._last_logits()

    def step(self, token: int):
        self.llm.eval([token])
        return self._last_logits()


def llama_bench_binary() -> Path | None:
    """llama.cpp's llama-bench: $LLAMA_BENCH, else where scripts/build_llama_cpp.sh puts it."""
    path = Path(os.environ.get(LLAMA_BENCH_VARIABLE) or LLAMA_BENCH_DEFAULT)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def run_llama_bench(binary: Path, gguf: Path, prompt_tokens: int, decode_tokens: int,
                    threads: int) -> tuple:
    """(prompt tok/s, decode tok/s) from one llama-bench run of each test on `gguf`."""
    import json
    import subprocess

    def tokens_per_second(*test_args) -> float:
        command = [str(binary), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json",
                   *test_args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-400:]}")
        (result,) = json.loads(done.stdout)
        return float(result["avg_ts"])

    prompt = tokens_per_second("-p", str(prompt_tokens), "-n", "0")
    decode = tokens_per_second("-p", "0", "-n", str(decode_tokens), "-d", str(prompt_tokens))
    return prompt, decode


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


# -- measurement ---------------------------------------------------------------------------
def measure(engine, prompt_ids, decode_tokens: int):
    """(prompt tok/s, decode tok/s, greedy ids) for one round."""
    engine.reset(len(prompt_ids) + decode_tokens + 1)
    started = time.perf_counter()
    logits = engine.prefill(prompt_ids)
    prompt_s = time.perf_counter() - started
    ids = [argmax(logits)]
    started = time.perf_counter()
    for _ in range(decode_tokens):
        ids.append(argmax(engine.step(ids[-1])))
    decode_s = time.perf_counter() - started
    return len(prompt_ids) / prompt_s, decode_tokens / decode_s, ids


def first_difference(ids, reference):
    if reference is None:
        return "-"
    for index, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return f"differ@{index}"
    return "same"


def prompt_token_ids(count: int, gguf: Path) -> list:
    """PROMPT_TEXT repeated and cut to `count` tokens by the tokenizer in `gguf`."""
    from candle_web.io.checkpoint import open_checkpoint

    tokenizer = open_checkpoint(gguf, "llama").tokenizer
    ids = []
    while len(ids) < count:
        ids += tokenizer.encode(PROMPT_TEXT, add_special_tokens=False).ids
    return ids[:count]


def print_table(rows):
    """One line per (model, engine); ratios are tok/s over PyTorch's (decode) and llama.cpp's
    (prompt and decode) measured in the same model's rounds."""
    header = (f"{'model':6} {'engine':14} {'load s':>7} {'prompt tok/s':>13} "
              f"{'decode tok/s':>13} {'x torch':>8} {'prompt x cpp':>13} "
              f"{'decode x cpp':>13} {'ids':>10}")
    print(header)
    print("-" * len(header))
    peers = {(r["quant"], r["engine"]): r for r in rows if r["engine"] in ("torch", "llama.cpp")}

    def ratio(row, peer, field):
        return f"{row[field] / peer[field]:.2f}" if peer else "-"

    for r in rows:
        torch_row = peers.get((r["quant"], "torch"))
        cpp_row = peers.get((r["quant"], "llama.cpp"))
        print(f"{r['quant']:6} {r['engine']:14} {r['load']:7.2f} {r['prompt']:13.1f} "
              f"{r['decode']:13.1f} {ratio(r, torch_row, 'decode'):>8} "
              f"{ratio(r, cpp_row, 'prompt'):>13} {ratio(r, cpp_row, 'decode'):>13} "
              f"{r['ids']:>10}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quants", default=",".join(QUANTS))
    parser.add_argument("--backends", default="numpy,numba")
    parser.add_argument("--compute-types", default="float32,int8",
                        help="the numba backend's compute types, each its own engine (cw-numba "
                             "is float32, cw-numba-int8 the integer products)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-llama-cpp", action="store_true")
    args = parser.parse_args(argv)
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(args.threads)
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    unknown = sorted(set(quants) - set(QUANTS))
    if unknown:
        parser.error(f"unknown quant(s) {unknown}; choose from {QUANTS}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    compute_types = [c.strip() for c in args.compute_types.split(",") if c.strip()]
    import candle_native  # noqa: F401  (registers the numba backend)

    use_cpp = not args.no_llama_cpp and llama_cpp_available()
    bench_binary = None if args.no_llama_cpp or use_cpp else llama_bench_binary()
    load = os.getloadavg()
    print(f"{args.prompt_tokens}-token prompt, {args.decode_tokens} "
          f"greedy tokens, {args.threads} threads, median of {args.repeat}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if bench_binary is not None:
        print(f"llama.cpp: {bench_binary} (llama-bench, a subprocess in each model's rounds)")
    elif not use_cpp and not args.no_llama_cpp:
        print("llama.cpp: neither llama-cpp-python nor llama-bench found (run "
              "scripts/build_llama_cpp.sh); its column is left empty")

    rows = []
    with tempfile.TemporaryDirectory(prefix="candle-web-bench-llama-") as work:
        # One PyTorch model (SmolLM2's dequantized f32 checkpoint) measured again inside
        # every SmolLM2 model's rounds, so each row's ratio compares runs made under the same load.
        use_torch = not args.no_torch and any(quant != QWEN for quant in quants)
        models = prepare_models(sorted(set(quants) | ({"F32"} if use_torch else set()),
                                       key=QUANTS.index), Path(work))
        torch_engine = TorchEngine(models["F32"]["hf"], args.threads) if use_torch else None
        for quant in quants:
            files = models[quant]
            prompt_ids = prompt_token_ids(args.prompt_tokens, files["gguf"])
            engines = [CandleEngine(b, files.get("hf", files["gguf"]), compute)
                       for b in backends
                       for compute in (compute_types if b == "numba" else ["float32"])]
            if use_cpp:
                engines.append(LlamaCppEngine(files["gguf"], args.threads))
            if torch_engine is not None and quant != QWEN:
                engines.append(torch_engine)
            for engine in engines:  # warm-up: numba compiles (or loads its cache) on first use
                measure(engine, prompt_ids[:8], 2)
            per_engine = {engine.name: [] for engine in engines}
            bench_runs = []
            for _ in range(args.repeat):
                for engine in engines:
                    per_engine[engine.name].append(measure(engine, prompt_ids,
                                                           args.decode_tokens))
                if bench_binary is not None:
                    bench_runs.append(run_llama_bench(bench_binary, files["gguf"],
                                                      args.prompt_tokens, args.decode_tokens,
                                                      args.threads))
            reference = per_engine[engines[0].name][0][2]
            for engine in engines:
                results = per_engine[engine.name]
                rows.append({"quant": quant, "engine": engine.name, "load": engine.load_s,
                             "prompt": _median([r[0] for r in results]),
                             "decode": _median([r[1] for r in results]),
                             "ids": "-" if engine is engines[0] else
                             first_difference(results[0][2], reference)})
            if bench_runs:
                rows.append({"quant": quant, "engine": "llama.cpp", "load": float("nan"),
                             "prompt": _median([r[0] for r in bench_runs]),
                             "decode": _median([r[1] for r in bench_runs]), "ids": "n/a"})
            del engines
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
