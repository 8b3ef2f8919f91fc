"""The fuzz targets: one function per parser, called with one (mutated) input as bytes.

A target calls the parser through the entry point a user calls, then uses the result the way
the package does (encode and decode with a tokenizer, dequantize a tensor, build the model
config), since many bugs only show once a lying header is believed. A case passes when the
function returns or raises a CandleError; anything else is a finding (see harness.py).

The functions run in the fuzzing child (fuzz_worker.py), under the address-space cap; they
must not catch exceptions themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

SAMPLE_TEXT = "Hello world! It's 2024: naïve café, 日本語, emoji 😀, tabs\tand  spaces."
SAMPLE_PAIR = "A second sentence."
# Tensors above this many bytes are parsed but not materialised: the parser has already
# checked that their bytes are present, and converting them would only cost time.
MAX_MATERIALISED_BYTES = 1 << 20
MAX_TENSORS_READ = 16


@dataclasses.dataclass(frozen=True)
class Target:
    """``run(data)``: the case; ``seeds``: the seeds_testlib builder; ``kind``: for config.json
    targets, the seeds of this loader (others are used less often)."""

    name: str
    run: object
    seeds: str
    about: str
    kind: str = ""


# -- tokenizer.json ----------------------------------------------------------------------------
def use_tokenizer(tokenizer) -> None:
    """Encode and decode a short text and a pair, as the pipelines do."""
    encoding = tokenizer.encode(SAMPLE_TEXT)
    tokenizer.decode(encoding.ids)
    tokenizer.decode(encoding.ids, skip_special_tokens=False)
    tokenizer.encode(SAMPLE_TEXT, SAMPLE_PAIR)
    tokenizer.get_vocab_size()
    for token_id in encoding.ids[:4]:
        tokenizer.id_to_token(token_id)


def tokenizer_json(data: bytes) -> None:
    from candle_web.tokenizers import Tokenizer

    use_tokenizer(Tokenizer.from_bytes(data))


# -- GGUF --------------------------------------------------------------------------------------
def _first_small_tensor(gguf):
    for name, info in gguf.tensors.items():
        if info.nbytes <= MAX_MATERIALISED_BYTES:
            return name
    return None


def gguf(data: bytes) -> None:
    """Parse, read every metadata value and tensor info, dequantize the first small tensor,
    build the embedded tokenizer and the LLaMA config, as Llama.load does."""
    from candle_web.io.gguf import GgufFile
    from candle_web.models.llama import LlamaConfig
    from candle_web.tokenizers import Tokenizer

    file = GgufFile(data)
    for key in file.metadata:
        file.get(key)
    for info in file.tensors.values():
        info.n_elements
    name = _first_small_tensor(file)
    if name is not None:
        file.qtensor(name).dequantize()
    use_tokenizer(Tokenizer.from_gguf_metadata(file.metadata))
    LlamaConfig.from_gguf(file)


# -- CTranslate2 -------------------------------------------------------------------------------
def ct2(data: bytes) -> None:
    """Parse, read small variables as float32 and scalars, resolve aliases, build Whisper."""
    from candle_web.io.ct2 import read_ct2
    from candle_web.io.weights import Ct2Weights
    from candle_web.models.whisper import Whisper

    model = read_ct2(data)
    for name in list(model.variables)[:MAX_TENSORS_READ]:
        model.dtype_of(name)
        array = model.variables[name]
        if array.ndim == 0:
            model.scalar(name)
        elif array.nbytes <= MAX_MATERIALISED_BYTES:
            model.get_f32(name)
    for alias in model.aliases:
        model[alias]
    Whisper.load(Ct2Weights(data))


# -- safetensors -------------------------------------------------------------------------------
def safetensors(data: bytes) -> None:
    from candle_web.io.safetensors import SafeTensors

    file = SafeTensors(data)
    file.metadata
    for name in file.keys()[:MAX_TENSORS_READ]:
        if file.info(name).nbytes <= MAX_MATERIALISED_BYTES:
            file.get_numpy(name)
            file.get(name)


# -- npy / npz ---------------------------------------------------------------------------------
def npy(data: bytes) -> None:
    from candle_web.io.npz import load_npy, read_npy

    read_npy(data)
    load_npy(data)


def npz(data: bytes) -> None:
    from candle_web.io.npz import NpzFile

    archive = NpzFile(data)
    for name in archive.keys()[:MAX_TENSORS_READ]:
        archive.info(name)
        archive.get_numpy(name)
        archive.get(name)


# -- PyTorch checkpoints -----------------------------------------------------------------------
def pytorch(data: bytes) -> None:
    """Parse (zip or legacy: the restricted pickle, the storages' sizes), then read small
    tensors as stored and as Tensors, and open the bytes as a weights source."""
    from candle_web.io.pytorch import TorchCheckpoint
    from candle_web.io.weights import open_weights

    file = TorchCheckpoint(data)
    for name in file.keys()[:MAX_TENSORS_READ]:
        info = file.info(name)
        if info.numel * info.storage.type.itemsize <= MAX_MATERIALISED_BYTES:
            file.get_numpy(name)
            file.get(name)
    open_weights(data).names()


# -- TensorFlow.js weights --------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _face_api_shards() -> dict:
    """The real .bin shards of face-api's models, by the name their manifests give them."""
    from tests.fuzz import seeds_testlib

    return {path.name: path.read_bytes() for path in seeds_testlib.face_api_files(".bin")}


def tfjs(data: bytes) -> None:
    """A (mutated) weights manifest over the real shards: TfjsWeights, then decode each small
    weight, as the face models load them."""
    from candle_web.io.tfjs import TfjsWeights

    weights = TfjsWeights(data, _face_api_shards(), "fuzz")
    for name in weights.names[:MAX_TENSORS_READ]:
        if weights.info(name).nbytes <= MAX_MATERIALISED_BYTES:
            weights.get_numpy(name)
            weights.get(name)


# -- WAV ---------------------------------------------------------------------------------------
def wav(data: bytes) -> None:
    """The header alone (as the browser's streaming reader does), read_wav, then load_audio
    (decode, downmix, resample to 16 kHz) as transcription does."""
    from candle_web.io.audio import load_audio
    from candle_web.io.wav import parse_wav_header, read_wav

    parse_wav_header(data, allow_truncated=True)
    read_wav(data)
    load_audio(data, format="wav")


# -- config.json -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _scratch_folder() -> Path:
    """One folder per child process, rewritten every case (loaders take paths)."""
    return Path(tempfile.mkdtemp(prefix="candle-web-fuzz-"))


def _model_folder(config: bytes, weights: dict) -> Path:
    folder = _scratch_folder()
    for stale in folder.iterdir():
        stale.unlink()
    (folder / "config.json").write_bytes(config)
    for name, content in weights.items():
        (folder / name).write_bytes(content)
    return folder


@functools.lru_cache(maxsize=1)
def _empty_safetensors() -> bytes:
    """A valid safetensors file with no tensors: the loaders parse config.json before they
    look for weights, so this reaches the config parsing and then fails with a typed error."""
    from candle_web.io.safetensors import serialize

    return serialize({})


@functools.lru_cache(maxsize=1)
def _small_whisper_bin() -> bytes:
    from tests.fuzz import seeds_testlib

    built = seeds_testlib.small_whisper_ct2_bytes()
    if built is None:
        raise RuntimeError("whisper-tiny.en model.bin is not in the cache")
    return built[0]


def config_bert(data: bytes) -> None:
    from candle_web.models import bert

    bert._read_config(str(_model_folder(data, {}) / "config.json"))


def config_t5(data: bytes) -> None:
    from candle_web.models import t5

    t5._read_config(str(_model_folder(data, {}) / "config.json"))


def config_llama(data: bytes) -> None:
    from candle_web.models.llama import Llama

    Llama.from_pretrained(_model_folder(data, {"model.safetensors": _empty_safetensors()}))


def config_whisper_ct2(data: bytes) -> None:
    """faster-whisper's config.json (suppress ids, alignment heads, language ids) next to a
    small real model.bin, loaded the way Whisper.from_pretrained loads a CT2 folder."""
    from candle_web.models.whisper import Whisper

    Whisper.from_pretrained(_model_folder(data, {"model.bin": _small_whisper_bin()}))


def config_whisper_hf(data: bytes) -> None:
    from candle_web.models.whisper import Whisper

    Whisper.from_pretrained(_model_folder(data, {"model.safetensors": _empty_safetensors()}))


# -- deliberately broken targets (the harness's own tests) -------------------------------------
def broken_key_error(data: bytes) -> None:
    """Raises an untyped KeyError on about half the inputs; a CandleError on the others."""
    from candle_web.core.errors import FormatError

    if data and data[0] % 2:
        raise KeyError("odd first byte")
    raise FormatError("even first byte: a typed error, which passes")


def broken_hang(data: bytes) -> None:
    time.sleep(3600)


def broken_regex_hang(data: bytes) -> None:
    """Catastrophic backtracking: a hang inside re's C code, where no signal handler runs."""
    re.match(r"(a+)+$", "a" * 64 + "b")


def broken_allocation(data: bytes) -> None:
    np.ones(3 << 30, dtype=np.uint8)  # 3 GiB: beyond the 2 GiB cap


def broken_crash(data: bytes) -> None:
    os.abort()


TARGETS = {t.name: t for t in (
    Target("tokenizer.json", tokenizer_json, "tokenizer",
           "Tokenizer.from_bytes + encode/decode (BPE, WordPiece, Unigram)"),
    Target("gguf", gguf, "gguf", "GgufFile + dequantize + embedded tokenizer + LlamaConfig"),
    Target("ct2", ct2, "ct2", "read_ct2 + variables + Whisper.load"),
    Target("safetensors", safetensors, "safetensors", "SafeTensors + get_numpy/get"),
    Target("npy", npy, "npy", "read_npy + load_npy"),
    Target("npz", npz, "npz", "NpzFile + get_numpy/get"),
    Target("pytorch", pytorch, "pytorch", "TorchCheckpoint (zip + legacy) + get_numpy/get"),
    Target("wav", wav, "wav", "parse_wav_header + read_wav + load_audio"),
    Target("tfjs", tfjs, "tfjs", "TfjsWeights (manifest over real shards) + get_numpy/get"),
    Target("config.bert", config_bert, "config", "bert config.json", kind="bert"),
    Target("config.t5", config_t5, "config", "t5 config.json", kind="t5"),
    Target("config.llama", config_llama, "config", "llama config.json (Llama.from_pretrained)",
           kind="llama"),
    Target("config.whisper-ct2", config_whisper_ct2, "config",
           "faster-whisper config.json (Whisper.from_pretrained)", kind="whisper-ct2"),
    Target("config.whisper-hf", config_whisper_hf, "config",
           "HF whisper config.json (Whisper.from_pretrained)", kind="whisper-hf"),
)}

BROKEN_TARGETS = {t.name: t for t in (
    Target("broken.key-error", broken_key_error, "", "raises KeyError on odd first bytes"),
    Target("broken.hang", broken_hang, "", "sleeps for an hour"),
    Target("broken.regex-hang", broken_regex_hang, "", "backtracks in re for ages"),
    Target("broken.allocation", broken_allocation, "", "allocates 3 GiB"),
    Target("broken.crash", broken_crash, "", "aborts the process"),
)}


def find(name: str) -> Target:
    return TARGETS.get(name) or BROKEN_TARGETS[name]


# -- issue 28: ordinary hostile input: texts, patterns, vocabularies, special files -----------
# Texts of this many characters run through each accepted pattern. The load-time check promises
# O(n^2) per piece for what it accepts (README "Bounds"); the slowest accepted shape found,
# `(?:...|\s+(?!\S)|\s+)\p{L}+` on spaces, costs 12 s at 3,000 characters and ~3 s at 1,500 here,
# within the case limit, while what grows faster still hangs (`.*.*.*.*.*=`, exponential shapes).
PATTERN_PROBE_CHARS = 1500
PATTERN_PROBES = ("a" * PATTERN_PROBE_CHARS, " " * PATTERN_PROBE_CHARS,
                  "=a" * (PATTERN_PROBE_CHARS // 2), "ab " * (PATTERN_PROBE_CHARS // 3))


@functools.lru_cache(maxsize=1)
def _real_tokenizers() -> tuple:
    """The cached models' tokenizers (BPE, WordPiece, Unigram, SentencePiece GGUF), built once
    per child."""
    from tests.fuzz import seeds_testlib
    from candle_web.io.gguf import GgufFile
    from candle_web.tokenizers import Tokenizer

    import json

    found = []
    for model in seeds_testlib.TOKENIZER_MODELS:
        path = seeds_testlib.cached(model, "tokenizer.json")
        if path is None:
            continue
        if path.stat().st_size <= seeds_testlib.MAX_WHOLE_TOKENIZER_BYTES:
            found.append(Tokenizer.from_file(path))
        else:  # e5's 17 MB: its normalizer (a precompiled charsmap) with a cut vocabulary
            found.append(Tokenizer.from_dict(seeds_testlib.reduce_tokenizer(
                json.loads(path.read_bytes()))))
    for index, (model, filename) in enumerate(seeds_testlib.GGUF_FILES):
        path = seeds_testlib.cached(model, filename)
        if path is not None:
            metadata = GgufFile(path).metadata
            if index:  # Gemma's 262k pieces take seconds: cut
                metadata = seeds_testlib._small_vocab_metadata(metadata)
            found.append(Tokenizer.from_gguf_metadata(metadata))
    return tuple(found)


def tokenizer_text(data: bytes) -> None:
    """Encode a text as the CLI gets it (argv bytes decoded with surrogateescape) with one of
    the real tokenizers, alone and as a pair; then the worker's text check."""
    import zlib

    from candle_web.worker.session import checked_text

    text = data.decode("utf-8", "surrogateescape")
    tokenizers = _real_tokenizers()
    if tokenizers:  # one per case, chosen by the input (cases stay reproducible and short)
        tokenizer = tokenizers[zlib.crc32(data) % len(tokenizers)]
        encoding = tokenizer.encode(text)
        tokenizer.decode(encoding.ids)
        tokenizer.encode(SAMPLE_PAIR, text)
    if text.strip():
        checked_text(text, "generate: the prompt", 1 << 20)


def tokenizer_regex(data: bytes) -> None:
    """A pattern as a Split pre-tokenizer and a Replace normalizer of a tokenizer.json; when it
    loads, encode long runs that a polynomial pattern backtracks on."""
    import json

    from candle_web.tokenizers import Tokenizer

    pattern = data.decode("utf-8", "surrogateescape")
    config = {"version": "1.0", "added_tokens": [], "post_processor": None, "decoder": None,
              "normalizer": {"type": "Replace", "pattern": {"Regex": pattern}, "content": "a"},
              "pre_tokenizer": {"type": "Split", "pattern": {"Regex": pattern},
                                "behavior": "Isolated", "invert": False},
              "model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1},
                        "unk_token": "<unk>"}}
    tokenizer = Tokenizer.from_bytes(json.dumps(config).encode("utf-8", "surrogatepass"))
    for text in PATTERN_PROBES:
        tokenizer.encode(text)


def gguf_vocabulary(data: bytes) -> None:
    """GGUF tokenizer metadata (JSON; numeric arrays as numpy, as the GGUF reader gives them):
    build the tokenizer, encode long runs of its own pieces' letters."""
    import json

    from candle_web.core.errors import FormatError
    from candle_web.tokenizers import Tokenizer

    try:
        metadata = json.loads(data)
    except (ValueError, RecursionError) as error:  # the harness's own JSON, not a GGUF file
        raise FormatError(f"not JSON: {error}") from None
    if not isinstance(metadata, dict):
        raise FormatError("not a JSON object")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        value = metadata.get(key)
        if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           for v in value):
            try:  # as the reader gives them; what no GGUF array can hold stays a list
                metadata[key] = np.array(value, np.float32 if key.endswith("scores")
                                         else np.int32)
            except (OverflowError, ValueError):
                pass
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    use_tokenizer(tokenizer)
    for text in ("a" * 2000, "ab" * 1000, "\u2581a" * 1000, "a b " * 500):
        tokenizer.encode(text)


@functools.lru_cache(maxsize=1)
def _special_paths() -> dict:
    """kind -> a path of that kind (seeds_testlib.SPECIAL_FILE_KINDS), made once per child."""
    import socket

    folder = _scratch_folder()
    fifo = folder / "fifo.wav"
    os.mkfifo(fifo)
    link = folder / "zero.wav"
    link.symlink_to("/dev/zero")
    regular = folder / "regular.wav"
    regular.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")
    bound = socket.socket(socket.AF_UNIX)
    sock = folder / "socket.wav"
    bound.bind(str(sock))
    _special_paths.keep = bound  # the socket file lives as long as the child
    return {"/dev/zero": "/dev/zero", "/dev/urandom": "/dev/urandom", "/dev/null": "/dev/null",
            "fifo": str(fifo), "directory": str(folder), "symlink to /dev/zero": str(link),
            "socket": str(sock), "regular": str(regular)}


SPECIAL_FILE_READERS = ("load_audio", ".gguf", ".safetensors", ".bin", ".npz", ".pt")


def special_file(data: bytes) -> None:
    """A path the CLI may be given that is not a regular file, through the reader the CLI
    uses for it (load_audio for `transcribe FILE`, open_weights for a weights file)."""
    from tests.fuzz import seeds_testlib
    from candle_web.io.audio import load_audio
    from candle_web.io.weights import open_weights

    data = bytes(data) + b"\0\0"  # a mutation may have cut the two bytes off
    kind = seeds_testlib.SPECIAL_FILE_KINDS[data[0] % len(seeds_testlib.SPECIAL_FILE_KINDS)]
    reader = SPECIAL_FILE_READERS[data[1] % len(SPECIAL_FILE_READERS)]
    path = _special_paths()[kind]
    if reader == "load_audio":
        load_audio(path)
        return
    # Weights: the reader is chosen by suffix; a link with that suffix points at the path.
    alias = _scratch_folder() / f"weights-{kind.replace('/', '_').replace(' ', '_')}{reader}"
    if not alias.is_symlink():
        alias.symlink_to(path)
    open_weights(str(alias))


TARGETS.update({t.name: t for t in (
    Target("tokenizer.text", tokenizer_text, "text",
           "real tokenizers' encode on hostile texts (lone surrogates, long runs)"),
    Target("tokenizer.regex", tokenizer_regex, "regex",
           "Split/Replace patterns (exponential, polynomial) + encode of 3,000-char runs"),
    Target("gguf.vocab", gguf_vocabulary, "vocab",
           "GGUF tokenizer metadata built to blow up merges and lookups"),
    Target("cli.special-file", special_file, "special-file",
           "/dev/zero, FIFOs, folders, sockets through load_audio and open_weights"),
)})
