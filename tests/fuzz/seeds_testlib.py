"""Seed inputs for each fuzz target, made from the real files in the model cache.

Small real files (tokenizer.json, config.json, WAVs) are used whole. The 75-250 MB model files
are impractical to mutate whole, so each gives (a) its first SEED_PREFIX_BYTES (a real header
cut short: an interesting input of its own) and (b) a small file of the same format written
from its real metadata and a few of its real tensors, sliced small. Every seed records its
integer fields (counts, lengths, offsets, dtypes), because boundary values written over them
find more than random noise does (see mutators_testlib).

Seeds are built in the fuzzing parent once per run; a missing cache file just drops the seeds
made from it (``missing`` lists them, so a run can say what it could not use).
"""

from __future__ import annotations

import functools
import io
import json
import struct
import warnings
import zipfile

import numpy as np

from candle_web import hub
from candle_web.core.errors import CandleError
from tests.fuzz.mutators_testlib import IntField, Seed, mutate_json_value

SEED_PREFIX_BYTES = 256 * 1024
# Vocabulary entries kept in the small tokenizer and GGUF seeds: enough for real merges and
# special tokens, small enough that parsing one case takes milliseconds.
SMALL_VOCAB = 600
# Each tensor dim of the small safetensors seeds is cut to this many entries.
SMALL_DIM = 8
# Integer fields recorded per array (a 600-token vocabulary would otherwise dominate).
MAX_FIELDS_PER_ARRAY = 8
WAV_EXCERPT_FRAMES = 2000
# GGUF metadata rebuilds tried per case before falling back to byte mutations.
REBUILD_ATTEMPTS = 4
# Rows kept of each real GGUF tensor in the small GGUF seeds.
GGUF_ROWS_KEPT = 4

TOKENIZER_MODELS = ("all-minilm-l6-v2", "whisper-tiny.en", "whisper-base",
                    "multilingual-e5-small", "t5-small", "flan-t5-small")
# Whole-file seeds larger than this are only used reduced (the e5 one is 17 MB).
MAX_WHOLE_TOKENIZER_BYTES = 3_000_000
CONFIG_MODELS = ("whisper-tiny.en", "whisper-base", "all-minilm-l6-v2", "t5-small",
                 "flan-t5-small")
GGUF_FILES = (("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"),
              ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf"))
WHISPER_CT2 = ("whisper-tiny.en", "model.bin")
SAFETENSORS_FILE = ("all-minilm-l6-v2", "model.safetensors")

missing: set = set()


def cached(model: str, filename: str):
    """Path of a cached model file, or None (recorded in ``missing``)."""
    try:
        return hub.fetch(model, filename, cache_only=True)
    except CandleError:
        missing.add(f"{model}/{filename}")
        return None


def speech_files() -> list:
    folder = hub.cache_dir() / "testdata" / "speech"
    files = sorted(folder.rglob("*.wav"))
    if not files:
        missing.add(f"{folder}/*.wav")
    return files


def _prefix_seed(name: str, path, **extra) -> Seed:
    with open(path, "rb") as handle:
        data = handle.read(SEED_PREFIX_BYTES)
    return Seed(name, data, **extra)


# -- tokenizer.json ----------------------------------------------------------------------------
def _reduce_bpe_or_wordpiece(model: dict) -> None:
    vocab = {token: i for token, i in model["vocab"].items() if i < SMALL_VOCAB}
    model["vocab"] = vocab
    if "merges" in model:
        kept = []
        for merge in model["merges"]:
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            if left in vocab and right in vocab and left + right in vocab:
                kept.append(merge)
        model["merges"] = kept


def reduce_tokenizer(config: dict) -> dict:
    """The same tokenizer.json with its vocabulary cut to the first SMALL_VOCAB entries
    (merges kept when all three of their tokens survive); everything else untouched."""
    model = config["model"]
    if model.get("type") == "Unigram":
        model["vocab"] = model["vocab"][:SMALL_VOCAB]
    elif isinstance(model.get("vocab"), dict):
        _reduce_bpe_or_wordpiece(model)
    return config


# Every component type of the HF format (DESIGN.md section 4) in one place. None of the real
# files uses a Split, Digits, Replace or CTC; with these as transplant donors the fuzzer can put
# any of them anywhere (a Sequence inside a Sequence, a decoder where a normalizer belongs...).
COMPONENT_LIBRARY = {
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "NFKD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        {"type": "Replace", "pattern": {"String": "``"}, "content": "\""},
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Nmt"}]},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+|[^\\s\\w]+|\\w+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation", "behavior": "Isolated"}, {"type": "WhitespaceSplit"},
        {"type": "Whitespace"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        {"type": "BertPreTokenizer"}]},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        {"type": "CTC", "pad_token": "[PAD]", "word_delimiter_token": "|", "cleanup": True},
        {"type": "BPEDecoder", "suffix": "</w>"},
        {"type": "WordPiece", "prefix": "##", "cleanup": True}]},
    "post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}]},
}


def component_library_seed(config: dict) -> Seed:
    """A real reduced tokenizer.json (all-minilm's) with the components above."""
    config = dict(config, **COMPONENT_LIBRARY)
    data = json.dumps(config, ensure_ascii=False).encode()
    return Seed("all-minilm-l6-v2 tokenizer.json (vocab cut, every component type)", data,
                json_span=(0, len(data)))


def tokenizer_seeds() -> list:
    seeds = []
    for model in TOKENIZER_MODELS:
        path = cached(model, "tokenizer.json")
        if path is None:
            continue
        data = path.read_bytes()
        if len(data) <= MAX_WHOLE_TOKENIZER_BYTES:
            # Whole real files are slow to parse (0.1-0.2 s): picked less often.
            seeds.append(Seed(f"{model}/tokenizer.json", data, json_span=(0, len(data)),
                              weight=0.1))
        small = json.dumps(reduce_tokenizer(json.loads(data)), ensure_ascii=False).encode()
        seeds.append(Seed(f"{model}/tokenizer.json (vocab cut to {SMALL_VOCAB})", small,
                          json_span=(0, len(small))))
        if model == "all-minilm-l6-v2":
            seeds.append(component_library_seed(json.loads(small)))
    return seeds


# -- config.json -------------------------------------------------------------------------------
def _json_seed(name: str, value, kind: str) -> Seed:
    data = json.dumps(value, indent=2).encode()
    return Seed(name, data, json_span=(0, len(data)), kind=kind)


def _llama_config_from_gguf() -> dict | None:
    """SmolLM2's HF config.json rebuilt from its GGUF metadata (the cache holds the GGUF only)."""
    path = cached(*GGUF_FILES[0])
    if path is None:
        return None
    from candle_web.io.gguf import GgufFile

    meta = GgufFile(str(path)).metadata
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": int(meta["llama.vocab_size"]),
            "hidden_size": int(meta["llama.embedding_length"]),
            "intermediate_size": int(meta["llama.feed_forward_length"]),
            "num_hidden_layers": int(meta["llama.block_count"]),
            "num_attention_heads": int(meta["llama.attention.head_count"]),
            "num_key_value_heads": int(meta["llama.attention.head_count_kv"]),
            "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
            "rope_theta": float(meta["llama.rope.freq_base"]),
            "max_position_embeddings": int(meta["llama.context_length"]),
            "rope_scaling": None, "tie_word_embeddings": True,
            "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
            "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"])}


def _whisper_hf_config_from_ct2() -> dict | None:
    """An HF Whisper config.json with whisper-tiny.en's real sizes and suppress lists."""
    model_path, config_path = cached(*WHISPER_CT2), cached(WHISPER_CT2[0], "config.json")
    if model_path is None or config_path is None:
        return None
    from candle_web.io.ct2 import read_ct2

    ct2 = read_ct2(str(model_path))
    ct2_config = json.loads(config_path.read_text())

    def layers(side):
        return sum(1 for name in ct2.variables if name.startswith(f"{side}/layer_")
                   and name.endswith("/ffn/linear_0/weight"))

    vocab, d_model = ct2.variables["decoder/embeddings/weight"].shape
    return {"model_type": "whisper", "num_mel_bins": ct2.variables["encoder/conv1/weight"].shape[1],
            "vocab_size": vocab, "d_model": d_model, "encoder_layers": layers("encoder"),
            "decoder_layers": layers("decoder"),
            "encoder_attention_heads": int(ct2.scalar("encoder/num_heads")),
            "decoder_attention_heads": int(ct2.scalar("decoder/num_heads")),
            "max_source_positions": 1500, "max_target_positions": 448,
            "suppress_tokens": ct2_config.get("suppress_ids", []),
            "begin_suppress_tokens": ct2_config.get("suppress_ids_begin", [])}


def config_seeds() -> list:
    """Every real config.json in the cache (kind: whisper-ct2, bert, t5), plus LLaMA and HF
    Whisper configs rebuilt from real model files. ``Seed.kind`` lets a target prefer its own."""
    kinds = {"whisper-tiny.en": "whisper-ct2", "whisper-base": "whisper-ct2",
             "all-minilm-l6-v2": "bert", "t5-small": "t5", "flan-t5-small": "t5"}
    seeds = []
    for model in CONFIG_MODELS:
        path = cached(model, "config.json")
        if path is not None:
            data = path.read_bytes()
            seeds.append(Seed(f"{model}/config.json", data, json_span=(0, len(data)),
                              kind=kinds[model]))
    llama = _llama_config_from_gguf()
    if llama is not None:
        seeds.append(_json_seed("llama config.json from SmolLM2's GGUF metadata", llama, "llama"))
    whisper = _whisper_hf_config_from_ct2()
    if whisper is not None:
        seeds.append(_json_seed("HF whisper config.json from whisper-tiny.en", whisper,
                                "whisper-hf"))
    return seeds


# -- GGUF --------------------------------------------------------------------------------------
class _GgufWalker:
    """Records the offsets of a valid GGUF's integer fields (header counts, key/string lengths,
    value types, array counts, tensor dims, dtypes and offsets)."""

    SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def __init__(self, data: bytes):
        self.data, self.pos, self.fields = data, 0, []

    def take(self, width: int, record: bool = True) -> int:
        if record:
            self.fields.append(IntField(self.pos, width))
        value = int.from_bytes(self.data[self.pos:self.pos + width], "little")
        self.pos += width
        return value

    def string(self, record: bool = True) -> None:
        length = self.take(8, record)
        self.pos += length

    def value(self, value_type: int, record: bool = True) -> None:
        if value_type == 8:
            self.string(record)
        elif value_type == 9:
            item_type, count = self.take(4, record), self.take(8, record)
            for index in range(count):
                self.value(item_type, record and index < MAX_FIELDS_PER_ARRAY)
        else:
            self.pos += self.SCALAR_SIZES[value_type]

    def walk(self) -> tuple:
        self.pos = 4  # magic
        self.take(4)  # version
        n_tensors, n_kv = self.take(8), self.take(8)
        for _ in range(n_kv):
            self.string()
            self.value(self.take(4))
        for _ in range(n_tensors):
            self.string()
            n_dims = self.take(4)
            for _ in range(n_dims):
                self.take(8)
            self.take(4)  # dtype
            self.take(8)  # offset
        return tuple(self.fields), self.pos


def _small_vocab_metadata(metadata: dict) -> dict:
    """The real metadata with the tokenizer arrays cut to SMALL_VOCAB tokens."""
    small = dict(metadata)
    tokens = list(metadata["tokenizer.ggml.tokens"])[:SMALL_VOCAB]
    small["tokenizer.ggml.tokens"] = tokens
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in metadata:
            small[key] = metadata[key][:SMALL_VOCAB]
    if "tokenizer.ggml.merges" in metadata:
        vocab = set(tokens)
        small["tokenizer.ggml.merges"] = [
            merge for merge in metadata["tokenizer.ggml.merges"][:20 * SMALL_VOCAB]
            if all(part in vocab for part in merge.split(" ", 1)) and merge.replace(" ", "", 1)
            in vocab]
    return small


def _small_tensors(gguf) -> dict:
    """A few real tensors, quantized ones cut to their first rows (rows are whole blocks)."""
    from candle_web.quantized import QTensor

    wanted = ("token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
              "blk.0.attn_k.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight")
    tensors = {}
    for name in wanted:
        if name not in gguf.tensors:
            continue
        info = gguf.tensors[name]
        if len(info.shape) == 1:
            shape, count = info.shape, info.nbytes
        else:
            # Candle order: the first dim counts rows, each row whole GGML blocks.
            rows = min(info.shape[0], GGUF_ROWS_KEPT)
            shape = (rows,) + tuple(info.shape[1:])
            count = info.nbytes // info.shape[0] * rows
        raw = np.array(gguf.tensor_bytes(name)[:count])
        tensors[name] = QTensor(info.dtype, shape, raw)
    return tensors


def _write_gguf_bytes(metadata: dict, tensors: dict, types: dict) -> bytes:
    from candle_web.io.gguf import write_gguf

    out = io.BytesIO()
    write_gguf(out, metadata, tensors, metadata_types=types)
    return out.getvalue()


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _same_kind(old, new) -> bool:
    """Whether the declared GGUF type of ``old`` still fits ``new`` (else let the writer infer)."""
    if type(old) is not type(new):
        return False
    if isinstance(old, list):
        return bool(old) and bool(new) and type(old[0]) is type(new[0])
    return True


def _gguf_rebuilder(metadata: dict, types: dict, tensors: dict):
    """rebuild(rng): the metadata mutated as a JSON tree (types changed, keys dropped, ids out
    of range, token lists cut...) and sometimes a tensor dropped or renamed, re-encoded by the
    project's GGUF writer, so the file is well-formed but its content lies."""
    original = {key: _jsonable(value) for key, value in metadata.items()}
    encoded = json.dumps(original, default=str)

    def attempt(rng):
        tree = json.loads(encoded)
        raws: list = []
        for _ in range(rng.randint(1, 3)):
            tree = mutate_json_value(rng, tree, raws)
        if raws or not isinstance(tree, dict):
            return None  # raw JSON text has no GGUF encoding
        kept_types = {k: t for k, t in types.items() if k in tree and _same_kind(original.get(k),
                                                                                tree[k])}
        chosen = dict(tensors)
        if chosen and rng.random() < 0.2:
            name = rng.choice(sorted(chosen))
            tensor = chosen.pop(name)
            if rng.random() < 0.5:
                chosen[name + ".renamed"] = tensor
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy's overflow warnings on huge values
                return _write_gguf_bytes(tree, chosen, kept_types)
        except (CandleError, TypeError, ValueError, OverflowError, struct.error):
            return None  # a value the writer cannot encode (null, an object...)

    def rebuild(rng):
        # About half the tree mutations have no GGUF encoding: try a few before giving up.
        for _ in range(REBUILD_ATTEMPTS):
            data = attempt(rng)
            if data is not None:
                return data
        return None

    return rebuild


def _small_gguf_seeds(name: str, path) -> list:
    from candle_web.io.gguf import GgufFile

    gguf = GgufFile(str(path))
    metadata = _small_vocab_metadata(gguf.metadata)
    types = dict(gguf.metadata_types)
    tensors = _small_tensors(gguf)
    data = _write_gguf_bytes(metadata, tensors, types)
    fields, header_end = _GgufWalker(data).walk()
    small = Seed(f"{name} (vocab {SMALL_VOCAB}, {len(tensors)} sliced tensors)", data,
                 fields=fields, header_end=header_end,
                 rebuild=_gguf_rebuilder(metadata, types, tensors))
    # The same file with its tensor data cut just after the header: what a partial download is.
    cut = Seed(f"{name} (small, tensor data truncated)", data[:header_end + 64], fields=fields,
               header_end=header_end, weight=0.3)
    return [small, cut]


def gguf_seeds() -> list:
    seeds = []
    for model, filename in GGUF_FILES:
        path = cached(model, filename)
        if path is None:
            continue
        seeds += _small_gguf_seeds(f"{model}/{filename}", path)
        seeds.append(_prefix_seed(f"{model}/{filename} (first {SEED_PREFIX_BYTES} bytes)", path,
                                  weight=0.2))
    return seeds


# -- CTranslate2 model.bin ---------------------------------------------------------------------
CT2_DTYPE_IDS = {np.dtype("<f4"): 0, np.dtype("i1"): 1, np.dtype("<i2"): 2, np.dtype("<i4"): 3,
                 np.dtype("<f2"): 4}


class Ct2Writer:
    """Writes the CTranslate2 layout of DESIGN.md section 4 (the package has no CT2 writer),
    recording every integer field's offset for the mutator."""

    def __init__(self):
        self.out, self.fields = bytearray(), []

    def u(self, value: int, width: int) -> None:
        self.fields.append(IntField(len(self.out), width))
        self.out += value.to_bytes(width, "little")

    def string(self, text: str) -> None:
        raw = text.encode() + b"\0"
        self.u(len(raw), 2)
        self.out += raw

    def variable(self, name: str, array: np.ndarray, version: int) -> None:
        self.string(name)
        self.u(array.ndim, 1)
        for dim in array.shape:
            self.u(dim, 4)
        if version >= 4:
            self.u(CT2_DTYPE_IDS[array.dtype], 1)
            self.u(array.nbytes, 4)
        else:
            self.u(array.dtype.itemsize, 1)
            self.u(array.size, 4)
        self.out += np.ascontiguousarray(array).tobytes()

    def model(self, variables: dict, aliases: dict, spec: str, revision: int,
              version: int) -> bytes:
        self.u(version, 4)
        if version >= 2:
            self.string(spec)
            self.u(revision, 4)
        self.u(len(variables), 4)
        for name, array in variables.items():
            self.variable(name, array, version)
        if version >= 3:
            self.u(len(aliases), 4)
            for alias, target in aliases.items():
                self.string(alias)
                self.string(target)
        return bytes(self.out)


def _slice_small(array: np.ndarray) -> np.ndarray:
    return array[tuple(slice(0, SMALL_DIM) for _ in array.shape)]


def _whisper_small_dim(dim: int, d_model: int, small_d_model: int) -> int:
    """Multiples of d_model (fused QKV 3d, KV 2d, FFN 4d) shrink in proportion, so the small
    model's shapes stay consistent. The vocabulary, mel bins and positions stay real: the
    loader checks config.json's token ids against the vocabulary size."""
    if dim % d_model == 0 and dim // d_model <= 4:
        return dim // d_model * small_d_model
    return dim


@functools.lru_cache(maxsize=1)
def small_whisper_ct2() -> tuple | None:
    """(variables, aliases, spec, revision) of whisper-tiny.en with d_model cut to 2 per head:
    every real name, rank and dtype, all layers (config.json's alignment heads name them),
    consistent shapes, 1.4 MB (most of it the real-sized embedding table)."""
    path = cached(*WHISPER_CT2)
    if path is None:
        return None
    from candle_web.io.ct2 import read_ct2

    model = read_ct2(str(path))
    d_model = model.variables["decoder/embeddings/weight"].shape[1]
    small_d_model = 2 * int(model.scalar("encoder/num_heads"))
    variables = {}
    for name, array in model.variables.items():
        shape = [_whisper_small_dim(d, d_model, small_d_model) for d in array.shape]
        variables[name] = array[tuple(slice(0, d) for d in shape)]
    return variables, dict(model.aliases), model.spec_name, model.revision


def small_whisper_ct2_bytes(version: int = 6) -> tuple | None:
    """(bytes, integer fields) of the small whisper model in CT2 binary ``version``."""
    parts = small_whisper_ct2()
    if parts is None:
        return None
    writer = Ct2Writer()
    data = writer.model(*parts, version=version)
    return data, tuple(writer.fields)


def ct2_seeds() -> list:
    seeds = []
    for version in (6, 3, 1):
        built = small_whisper_ct2_bytes(version)
        if built is None:
            return seeds
        data, fields = built
        weight = 1.0 if version == 6 else 0.3
        seeds.append(Seed(f"whisper-tiny.en model.bin (d_model 2 per head, binary version "
                          f"{version})", data, fields=fields, weight=weight))
    seeds.append(_prefix_seed(f"whisper-tiny.en model.bin (first {SEED_PREFIX_BYTES} bytes)",
                              cached(*WHISPER_CT2), weight=0.2))
    return seeds


# -- safetensors -------------------------------------------------------------------------------
def _safetensors_bytes(entries: list, metadata: dict) -> bytes:
    """entries: (name, dtype name, shape, raw bytes); the header written as the format says."""
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, dtype_name, shape, raw in entries:
        header[name] = {"dtype": dtype_name, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _safetensors_seed(name: str, data: bytes, **extra) -> Seed:
    (length,) = struct.unpack_from("<Q", data)
    return Seed(name, data, fields=(IntField(0, 8),), header_end=8 + length,
                json_span=(8, 8 + length), json_length_field=IntField(0, 8), **extra)


def safetensors_seeds() -> list:
    path = cached(*SAFETENSORS_FILE)
    if path is None:
        return []
    from candle_web.io.safetensors import SafeTensors

    real = SafeTensors(str(path))
    names = real.keys()[:4]
    arrays = {name: _slice_small(real.get_numpy(name)) for name in names}
    first = next(iter(arrays.values())).astype("<f4").reshape(-1)
    # The real tensors as stored (F32), then their values in other stored dtypes the reader
    # converts (F16, BF16 bits, F8 bits, integers, bool).
    entries = [(name, "F32", array.shape, array.astype("<f4").tobytes())
               for name, array in arrays.items()]
    entries += [("as_f16", "F16", first.shape, first.astype("<f2").tobytes()),
                ("as_bf16", "BF16", first.shape, (first.view("<u4") >> 16).astype("<u2").tobytes()),
                # F8: the low byte of each f16, a valid if arbitrary 8-bit float
                ("as_f8_e4m3", "F8_E4M3", first.shape, first.astype("<f2").view("<u2")
                 .astype("u1").tobytes()),
                ("as_i64", "I64", first.shape, (first * 1000).astype("<i8").tobytes()),
                ("as_bool", "BOOL", first.shape, (first > 0).tobytes()),
                ("empty", "F32", (0, 3), b"")]
    small = _safetensors_bytes(entries, real.metadata)
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = handle.read(length)
    prefix = struct.pack("<Q", length) + header + b"\0" * 1024
    return [_safetensors_seed(f"{SAFETENSORS_FILE[0]} model.safetensors (4 tensors sliced, "
                              f"6 dtypes)", small),
            _safetensors_seed(f"{SAFETENSORS_FILE[0]} model.safetensors (real header, data cut)",
                              prefix, weight=0.3)]


# -- npy / npz ---------------------------------------------------------------------------------
def _real_arrays() -> dict:
    """A few real arrays in varied dtypes, shapes and layouts (npy/npz seeds)."""
    path = cached(*SAFETENSORS_FILE)
    if path is None:
        return {}
    from candle_web.io.safetensors import SafeTensors

    real = SafeTensors(str(path))
    name = next(n for n in real.keys() if len(real.info(n).shape) == 2)
    matrix = np.array(real.get_numpy(name)[:6, :5], dtype="<f4")
    return {"f32": matrix, "f16": matrix.astype("<f2"), "f64_big_endian": matrix.astype(">f8"),
            "i64": (matrix * 100).astype("<i8"), "bool": matrix > 0,
            "fortran": np.asfortranarray(matrix), "rank3": matrix.reshape(2, 3, 5),
            "scalar": np.array(matrix[0, 0]), "empty": np.zeros((0, 4), "<f4")}


def _npy_fields(data: bytes) -> tuple:
    """npy: the header length (u16 in v1, u32 in v2/v3). The version bytes are left to the
    byte mutations: as fields they made most cases fail the version check and nothing else."""
    length_width = 2 if data[6] == 1 else 4
    length = int.from_bytes(data[8:8 + length_width], "little")
    return (IntField(8, length_width),), 8 + length_width + length


def _npy_header_rebuilder(data: bytes):
    """rebuild(rng): the header dict with a changed descr, shape or order, correctly framed."""
    from candle_web.io.npz import parse_npy_header

    header = parse_npy_header(data)
    body = data[header.data_offset:]
    descrs = ("<f4", ">f4", "|b1", "<i8", "<U3", "|O", "V8", "<c8", "|S0", "<f2", "f4", "x",
              "<M8[s]", [("a", "<f4")])
    shapes = ((), (0,), (-1,), (2**31, 2**31), (2**63,), (1,) * 70, (3, 0, 2**62))

    def rebuild(rng):
        fields = {"descr": header.dtype.str, "fortran_order": header.fortran_order,
                  "shape": header.shape}
        choice = rng.randrange(4)
        if choice == 0:
            fields["descr"] = rng.choice(descrs)
        elif choice == 1:
            fields["shape"] = rng.choice(shapes)
        elif choice == 2:
            fields["fortran_order"] = rng.choice((1, "yes", None))
        else:
            fields.pop(rng.choice(sorted(fields)))
        text = repr(fields).encode("latin-1") + b" " * rng.randrange(3) + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body

    return rebuild


def npy_seeds() -> list:
    seeds = []
    for name, array in _real_arrays().items():
        out = io.BytesIO()
        np.save(out, array)  # numpy's own writer: the reference producer of the format
        data = out.getvalue()
        fields, header_end = _npy_fields(data)
        seeds.append(Seed(f"np.save of a real all-minilm tensor ({name})", data, fields=fields,
                          header_end=header_end, rebuild=_npy_header_rebuilder(data)))
    return seeds


ZIP_RECORD_FIELDS = {
    # signature: (offset, width) of each integer field after the signature's start
    b"PK\x03\x04": ((4, 2), (6, 2), (8, 2), (18, 4), (22, 4), (26, 2), (28, 2)),
    b"PK\x01\x02": ((8, 2), (10, 2), (20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (34, 2),
                    (42, 4)),
    b"PK\x05\x06": ((4, 2), (6, 2), (8, 2), (10, 2), (12, 4), (16, 4), (20, 2)),
    b"PK\x06\x06": ((4, 8), (24, 8), (32, 8), (40, 8), (48, 8)),
    b"PK\x06\x07": ((8, 8), (16, 4)),
}


def _zip_fields(data: bytes) -> tuple:
    """Integer fields of every zip record (local headers, central directory, end records)."""
    fields = []
    for signature, offsets in ZIP_RECORD_FIELDS.items():
        start = data.find(signature)
        while start != -1:
            fields += [IntField(start + offset, width) for offset, width in offsets
                       if start + offset + width <= len(data)]
            start = data.find(signature, start + 1)
    return tuple(fields)


def npz_seeds() -> list:
    from candle_web.io.npz import save

    arrays = _real_arrays()
    if not arrays:
        return []
    small = {name: arrays[name] for name in ("f32", "i64", "bool", "fortran", "empty")}
    variants = {"candle_web npz.save, stored": save(small),
                "candle_web npz.save, deflated": save(small, compressed=True)}
    for label, writer in (("np.savez", np.savez), ("np.savez_compressed", np.savez_compressed)):
        out = io.BytesIO()
        writer(out, **small)
        variants[label] = out.getvalue()
    seeds = []
    for label, data in variants.items():
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            first = archive.infolist()[0]
        header_end = first.header_offset + 30 + len(first.filename) + 128
        seeds.append(Seed(f"{label} of real all-minilm tensors", data, fields=_zip_fields(data),
                          header_end=header_end))
    return seeds


# -- WAV ---------------------------------------------------------------------------------------
class WavWriter:
    """RIFF/WAVE with the variants a reader must handle: PCM 8/16/24/32, float, extensible,
    extra chunks before "data", odd chunk padding, big-endian RIFX; integer fields recorded."""

    def __init__(self, big: bool = False):
        self.big = big
        self.order = "big" if big else "little"
        self.out, self.fields = bytearray(), []

    def u(self, value: int, width: int) -> None:
        self.fields.append(IntField(len(self.out), width, self.big))
        self.out += value.to_bytes(width, self.order)

    def chunk(self, chunk_id: bytes, body: bytes, write_body=None) -> None:
        self.out += chunk_id
        self.u(len(body), 4)
        if write_body is None:
            self.out += body
        else:
            write_body()
        if len(body) % 2:
            self.out += b"\0"  # RIFF pads odd chunks

    def fmt(self, tag: int, channels: int, rate: int, bits: int, extensible: bool) -> None:
        block = channels * ((bits + 7) // 8)
        size = 40 if extensible else 16
        self.out += b"fmt "
        self.u(size, 4)
        self.u(0xFFFE if extensible else tag, 2)
        self.u(channels, 2)
        self.u(rate, 4)
        self.u(rate * block, 4)
        self.u(block, 2)
        self.u(bits, 2)
        if extensible:
            self.u(22, 2)
            self.u(bits, 2)
            self.u((1 << channels) - 1, 4)
            self.u(tag, 2)
            self.out += bytes.fromhex("000000001000800000aa00389b71")

    def wav(self, payload: bytes, tag: int, channels: int, rate: int, bits: int,
            extensible: bool = False, extra_chunk: bytes | None = None) -> bytes:
        self.out += b"RIFX" if self.big else b"RIFF"
        self.u(0, 4)  # patched below
        self.out += b"WAVE"
        self.fmt(tag, channels, rate, bits, extensible)
        if extra_chunk is not None:
            self.chunk(b"LIST", extra_chunk)
        self.chunk(b"data", payload)
        self.out[4:8] = (len(self.out) - 8).to_bytes(4, self.order)
        return bytes(self.out)


def _pcm(samples: np.ndarray, bits: int, big: bool) -> bytes:
    """Interleaved integer PCM of float samples in [-1, 1] (8-bit is unsigned, as WAV says)."""
    if bits == 8:
        return np.clip(samples * 127 + 128, 0, 255).astype("u1").tobytes()
    scaled = np.clip(samples * (2 ** (bits - 1) - 1), -2 ** (bits - 1), 2 ** (bits - 1) - 1)
    ints = scaled.astype(np.int64)
    if bits == 24:
        order = "big" if big else "little"
        return b"".join(int(v).to_bytes(3, order, signed=True) for v in ints.reshape(-1))
    return ints.astype(f"{'>' if big else '<'}i{bits // 8}").tobytes()


def wav_seeds() -> list:
    from candle_web.io.wav import read_wav

    files = speech_files()
    if not files:
        return []
    seeds = []
    for path in files:
        if path.stat().st_size <= 120_000:  # whole real files, the smaller ones
            data = path.read_bytes()
            seeds.append(Seed(f"{path.name} (whole)", data, header_end=64, weight=0.2))
    stereo = next((p for p in files if "stereo" in p.name), files[0])
    samples, rate = read_wav(stereo.read_bytes())
    excerpt = np.asarray(samples[:WAV_EXCERPT_FRAMES], dtype=np.float64)
    if excerpt.ndim == 1:
        excerpt = excerpt[:, None]
    channels = excerpt.shape[1]
    variants = (("pcm16", 1, 16, False, False, None), ("pcm24 extensible", 1, 24, True, False,
                                                       None),
                ("pcm8", 1, 8, False, False, None), ("pcm32 + LIST chunk", 1, 32, False, False,
                                                     b"INFOISFT\x05\0\0\0fuzz\0"),
                ("float32", 3, 32, False, False, None), ("pcm16 RIFX", 1, 16, False, True, None))
    for label, tag, bits, extensible, big, extra in variants:
        if tag == 3:
            payload = excerpt.astype(">f4" if big else "<f4").tobytes()
        else:
            payload = _pcm(excerpt, bits, big)
        writer = WavWriter(big)
        data = writer.wav(payload, tag, channels, rate, bits, extensible, extra)
        seeds.append(Seed(f"{stereo.name} excerpt as {label}", data,
                          fields=tuple(writer.fields), header_end=data.find(b"data") + 8))
    return seeds


# -- PyTorch checkpoints ---------------------------------------------------------------------
PYTORCH_ALBERT = ("rxnmapper-albert", "pytorch_model.bin")
PYTORCH_PICKLE_ONLY = ("rxnmapper-albert", "training_args.bin")  # an argparse.Namespace
PYTORCH_BERT = ("rxnfp-bert-pretrained", "pytorch_model.bin")
PYTORCH_TENSORS_KEPT = 8
MAX_PICKLE_FIELDS = 400
# Pickle opcodes whose argument is (or starts with) an integer of this many bytes: values,
# memo keys and string lengths.
_PICKLE_INT_WIDTHS = {"BININT1": 1, "BININT2": 2, "BININT": 4, "BINPUT": 1, "BINGET": 1,
                      "LONG_BINPUT": 4, "LONG_BINGET": 4, "BINUNICODE": 4, "SHORT_BINUNICODE": 1,
                      "SHORT_BINSTRING": 1, "BINSTRING": 4, "SHORT_BINBYTES": 1, "BINBYTES": 4,
                      "LONG1": 1, "FRAME": 8, "BINUNICODE8": 8, "BINBYTES8": 8}


def _pickle_fields(data: bytes, start: int) -> tuple:
    """(integer fields, end offset) of the pickle at `start` (walked with pickletools, which
    only reads opcodes)."""
    import pickletools

    fields = []
    stream = io.BytesIO(data)
    stream.seek(start)
    try:
        for opcode, _, position in pickletools.genops(stream):
            width = _PICKLE_INT_WIDTHS.get(opcode.name)
            if width and len(fields) < MAX_PICKLE_FIELDS:
                fields.append(IntField(position + 1, width))
    except ValueError:
        pass  # a seed cut short (the prefix seed) ends inside a pickle
    return tuple(fields), stream.tell()


def _legacy_fields(data: bytes) -> tuple:
    """The integer fields of a legacy checkpoint's five pickles and its storage counts."""
    from candle_web.io.pytorch import TorchCheckpoint

    fields, end = (), 0
    for _ in range(5):
        found, end = _pickle_fields(data, end)
        fields += found
    try:
        storages = TorchCheckpoint(data)._storages.values()
    except CandleError:
        return fields  # the cut-short seed: its storages are not all there
    return fields + tuple(IntField(storage.start - 8, 8) for storage in storages)


def _torch_zip_fields(data: bytes) -> tuple:
    fields = _zip_fields(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    return fields + _pickle_fields(data, start)[0]


def _small_torch_checkpoints(path) -> dict:
    """The first real ALBERT tensors sliced small, plus a view, bf16, i64 and bool tensors,
    written by torch.save in both layouts (torch: the dev extra's reference)."""
    try:
        import torch
    except ImportError:
        missing.add("torch (to write the small PyTorch seeds)")
        return {}
    from candle_web.io.pytorch import TorchCheckpoint

    real = TorchCheckpoint(path)
    state = {}
    for name in real.keys()[:PYTORCH_TENSORS_KEPT]:
        array = _slice_small(np.array(real.get_numpy(name)))
        state[name] = torch.from_numpy(np.ascontiguousarray(array))
    first = state[next(iter(state))]
    state["view"] = first.reshape(-1)[1::3]
    state["bf16"] = first.bfloat16()
    state["i64"] = torch.arange(5)
    state["bool"] = torch.tensor([True, False])
    out = {}
    for layout, zipped in (("zip", True), ("legacy", False)):
        buffer = io.BytesIO()
        torch.save(state, buffer, _use_new_zipfile_serialization=zipped)
        out[layout] = buffer.getvalue()
    return out


def pytorch_seeds() -> list:
    seeds = []
    albert = cached(*PYTORCH_ALBERT)
    if albert is not None:
        for layout, data in _small_torch_checkpoints(albert).items():
            fields = _torch_zip_fields(data) if layout == "zip" else _legacy_fields(data)
            seeds.append(Seed(f"torch.save ({layout}) of real rxnmapper ALBERT tensors", data,
                              fields=fields))
    pickle_only = cached(*PYTORCH_PICKLE_ONLY)
    if pickle_only is not None:
        data = pickle_only.read_bytes()
        seeds.append(Seed("rxnmapper training_args.bin (legacy, an argparse.Namespace)", data,
                          fields=_legacy_fields(data), weight=0.5))
    bert = cached(*PYTORCH_BERT)
    if bert is not None:
        seed = _prefix_seed("rxnfp pytorch_model.bin (legacy), cut short", bert)
        seed.fields = _legacy_fields(seed.data)[:2 * MAX_PICKLE_FIELDS]
        seed.weight = 0.5
        seeds.append(seed)
    return seeds


# -- TensorFlow.js weights manifests ----------------------------------------------------------
FACE_API_MANIFESTS = ("tiny_face_detector_model-weights_manifest.json",
                      "ssd_mobilenetv1_model-weights_manifest.json",
                      "face_landmark_68_tiny_model-weights_manifest.json",
                      "age_gender_model-weights_manifest.json")


def face_api_files(suffix: str) -> list:
    """The cached face-api model files ending in `suffix` (registry model face-api)."""
    names = [file.name for file in hub.default_registry()["face-api"].files
             if file.name.endswith(suffix)]
    return [path for path in (cached("face-api", name) for name in names) if path is not None]


def tfjs_seeds() -> list:
    """Real manifests (a quantized detector, one with int32 weights, two small nets): the
    whole file is JSON, its shard sizes the real ones."""
    seeds = []
    for name in FACE_API_MANIFESTS:
        path = cached("face-api", name)
        if path is not None:
            data = path.read_bytes()
            seeds.append(Seed(name, data, json_span=(0, len(data))))
    return seeds


SEED_BUILDERS = {"tokenizer": tokenizer_seeds, "config": config_seeds, "gguf": gguf_seeds,
                 "ct2": ct2_seeds, "safetensors": safetensors_seeds, "npy": npy_seeds,
                 "npz": npz_seeds, "wav": wav_seeds, "pytorch": pytorch_seeds,
                 "tfjs": tfjs_seeds}



# -- issue 28: texts, regex patterns, vocabularies built to blow up, special files -------------
SEED_TEXTS = ("Hello world! It's 2024: na\u00efve caf\u00e9, \u65e5\u672c\u8a9e, emoji \U0001F600.",
              "def f(x):\n    return x  # code\n\n\n", "unaffable " * 50, " " * 300 + "x",
              "\u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947 "
              "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439\u0442\u0435")


def text_seeds() -> list:
    """Texts for the real tokenizers' encode: rebuilt with hostile pieces (invalid UTF-8,
    lone surrogates, long runs) most of the time."""
    from tests.fuzz.mutators_testlib import hostile_text

    return [Seed(f"text {index}", text.encode(),
                 rebuild=functools.partial(hostile_text, base=text.encode()))
            for index, text in enumerate(SEED_TEXTS)]


def regex_seeds() -> list:
    """Patterns of real files and hostile ones (exponential, polynomial, unparsable); the
    rebuild joins two of them, inside a repeat or side by side."""
    from candle_web.tokenizers import gguf_vocab
    from tests.fuzz.mutators_testlib import HOSTILE_PATTERNS

    real = [value for name, value in vars(gguf_vocab).items()
            if name.endswith("_PATTERN") and isinstance(value, str)]
    real.append("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
                "|\\s+(?!\\S)|\\s+")
    patterns = real + list(HOSTILE_PATTERNS)

    def rebuild(rng):
        left, right = rng.choice(patterns), rng.choice(patterns)
        joined = rng.choice((left + right, f"(?:{left})*{right}", f"{left}|{right}",
                             f"(?:{left}){right}", left))
        return joined.encode("utf-8", "surrogatepass")

    return [Seed(f"pattern {index}", pattern.encode("utf-8", "surrogatepass"), rebuild=rebuild)
            for index, pattern in enumerate(patterns)]


def vocab_seeds() -> list:
    """GGUF tokenizer metadata as JSON (the target turns arrays into what the GGUF reader
    gives), built to blow up derived tables; JSON-mutated or rebuilt."""
    import random

    from tests.fuzz.mutators_testlib import blow_up_vocabulary

    def rebuild(rng):
        return json.dumps(blow_up_vocabulary(rng)).encode()

    seeds = []
    for index in range(4):
        data = json.dumps(blow_up_vocabulary(random.Random(index))).encode()
        seeds.append(Seed(f"vocabulary {index}", data, json_span=(0, len(data)),
                          rebuild=rebuild))
    return seeds


# What a command-line path can name besides a regular file (targets_testlib.SPECIAL_PATHS).
SPECIAL_FILE_KINDS = ("/dev/zero", "/dev/urandom", "/dev/null", "fifo", "directory",
                      "symlink to /dev/zero", "socket", "regular")


def special_file_seeds() -> list:
    """One byte per case: which kind of path (SPECIAL_FILE_KINDS), then which reader."""
    return [Seed(kind, bytes([index, reader])) for index, kind in enumerate(SPECIAL_FILE_KINDS)
            for reader in range(6)]


SEED_BUILDERS.update({"text": text_seeds, "regex": regex_seeds, "vocab": vocab_seeds,
                      "special-file": special_file_seeds})
