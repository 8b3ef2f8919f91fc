"""One checkpoint opener: whatever names a model's files in, its parts out.

    checkpoint = open_checkpoint("path/to/folder")          # or a file, a registry name,
    checkpoint = open_checkpoint("org/name@revision")       # a Hub repo at a revision,
    checkpoint = open_checkpoint({"model.safetensors": data, "config.json": data, ...})
                                                            # or the bytes a worker received
    checkpoint.weights            a weights source (io/weights.py's open_weights)
    checkpoint.format             "safetensors", "gguf", "ct2", "pytorch"
    checkpoint.naming             the naming its writer uses: "hf", "gguf" or "ct2"
    checkpoint.config             config.json as a dict, or None
    checkpoint.metadata           a GGUF's metadata, or None
    checkpoint.tokenizer          from the GGUF's vocabulary, else tokenizer.json, else a
                                  WordPiece vocab.txt (BERT's)
    checkpoint.chat_template      GGUF metadata, chat_template.jinja or tokenizer_config.json
    checkpoint.generation_config  generation_config.json as a dict, or None

Which file holds the weights (io/weights.py's weights_files), in order: *.safetensors (all
shards), the one .gguf, a CTranslate2 model.bin, a PyTorch checkpoint (pytorch_model*.bin, one
.pt or .pth). A file given alone brings the side files beside it (config.json,
tokenizer.json...), nothing else.

Everything is read when first asked for, in the order the caller asks: a model reads its
config before its weights, so a broken config.json is named before gigabytes are mapped, and a
task that needs no tokenizer never parses one. Errors are typed and name the file, with the
model kind the caller gave (`kind="llama"`: "llama config.json /path/config.json: ...").
The `naming` is what the format's writer uses (GGUF files with llama.cpp's `general.
architecture`: "gguf"; GGUF files without one, e.g. Candle's quantized exports, keep Hugging
Face names); a model's WeightNames table still checks it against the tensors it finds.

The Hub grammar `org/name@revision` is hub.HubSpec's; fetching is the hub's (imported when
a name is not a local path).
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path

from ..core.errors import FormatError, ModelNotFound
from .weights import weights_files

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
VOCAB_FILE = "vocab.txt"
# The files a weights file given alone brings from its folder.
SIDE_FILES = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, GENERATION_CONFIG_FILE,
              CHAT_TEMPLATE_FILE, VOCAB_FILE)
# The special tokens of a BERT WordPiece vocabulary (those it has are added as special).
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What an "org/name@revision" that the registry does not list fetches by default.
DEFAULT_HUB_FILES = (CONFIG_FILE, TOKENIZER_FILE, "model.safetensors")
NAMING_OF_FORMAT = {"safetensors": "hf", "pytorch": "hf", "ct2": "ct2", "gguf": "gguf"}


def read_json_config(source, what: str) -> dict:
    """A JSON object (a config.json) as a dict, from a path, bytes-like data or an already
    parsed dict; any unreadable file, invalid UTF-8/JSON or a non-object raises FormatError
    naming `what` and the file."""
    if isinstance(source, dict):
        return source
    is_bytes = isinstance(source, (bytes, bytearray, memoryview)) or hasattr(source, "tobytes")
    if not (is_bytes or isinstance(source, (str, os.PathLike))):
        raise FormatError(f"{what}: expected a JSON object, got {type(source).__name__}")
    label = f"{what} {os.fspath(source)}" if isinstance(source, (str, os.PathLike)) else what
    try:
        if isinstance(source, (str, os.PathLike)):
            text = Path(source).read_text(encoding="utf-8")
        else:
            text = bytes(source).decode("utf-8")
        parsed = json.loads(text)
    except OSError as error:
        raise FormatError(f"{label}: cannot read it ({error.strerror or error})") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise FormatError(f"{label}: cannot read it: not JSON ({error})") from None
    except RecursionError:  # json recurses per nesting level: "[[[[..." exhausts the stack
        raise FormatError(f"{label}: cannot read it: nested too deeply") from None
    if not isinstance(parsed, dict):
        raise FormatError(f"{label}: expected a JSON object, got {type(parsed).__name__}")
    return parsed


class Checkpoint:
    """A model's files by name (paths, or bytes-like data the caller received), read on
    request; see the module doc. `label` names the checkpoint in messages (a folder, a file,
    "org/name@revision", "the received files"); `kind` names the model ("llama", "t5", ...)."""

    def __init__(self, files: dict, label: str, kind: str = "model"):
        for name, value in files.items():
            if not isinstance(name, str):
                raise FormatError(f"{label}: file names must be strings, got {name!r}")
            if not isinstance(value, (str, os.PathLike)):
                try:
                    memoryview(value)
                except TypeError:
                    raise FormatError(f"{label}: {name}: expected a path or bytes, got "
                                      f"{type(value).__name__}") from None
        self.files = dict(files)
        self.label = label
        self.kind = kind

    def __repr__(self) -> str:
        return f"Checkpoint({self.label!r}, kind={self.kind!r}, files={sorted(self.files)})"

    # -- one file ---------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.files

    def where(self, name: str) -> str:
        """How messages name file `name`: its path, or "name in <label>" for received bytes."""
        value = self.files[name]
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
        return f"{name} in {self.label}"

    def _file(self, name: str):
        """A path, or a memoryview of the bytes (no copy)."""
        value = self.files[name]
        return value if isinstance(value, (str, os.PathLike)) else memoryview(value)

    def json(self, name: str, what: str = None):
        """File `name` parsed as one JSON object, or None when absent; errors name `what`
        (default: the file name) and the file."""
        if name not in self.files:
            return None
        data = self._file(name)
        what = what or name
        if isinstance(data, memoryview):
            what = f"{what} ({self.label})"
        return read_json_config(data, what)

    def text(self, name: str):
        """File `name` as UTF-8 text, or None when absent."""
        if name not in self.files:
            return None
        data = self._file(name)
        try:
            raw = Path(data).read_bytes() if not isinstance(data, memoryview) else bytes(data)
            return raw.decode("utf-8")
        except OSError as error:
            raise FormatError(f"{self.where(name)}: cannot read it "
                              f"({error.strerror or error})") from None
        except UnicodeDecodeError as error:
            raise FormatError(f"{self.where(name)}: not UTF-8 text ({error})") from None

    # -- the weights ------------------------------------------------------------------------
    @cached_property
    def _weights_choice(self) -> tuple:
        return weights_files(self.files, self.label)

    @property
    def format(self) -> str:
        return self._weights_choice[0]

    @property
    def weight_files(self) -> list:
        return list(self._weights_choice[1])

    @cached_property
    def weights(self):
        from .weights import Ct2Weights, PytorchWeights, SafetensorsWeights, open_weights

        kind, names = self._weights_choice
        data = [self._file(name) for name in names]
        if kind == "ct2":  # open_weights cannot tell a model.bin's bytes from others
            return Ct2Weights(data[0])
        if len(data) == 1:
            return open_weights(data[0])
        # Shards (paths or bytes) as one namespace.
        return (PytorchWeights if kind == "pytorch" else SafetensorsWeights)(data)

    @property
    def gguf(self):
        """The parsed GGUF file, or None for other formats."""
        if self.format != "gguf":
            return None
        return self.weights.gguf

    @property
    def metadata(self):
        gguf = self.gguf
        return None if gguf is None else gguf.metadata

    @property
    def naming(self) -> str:
        if self.format == "gguf" and "general.architecture" not in self.metadata:
            return "hf"
        return NAMING_OF_FORMAT[self.format]

    # -- configuration ----------------------------------------------------------------------
    @property
    def config_label(self) -> str:
        """How messages name config.json: "<kind> config.json <path>"."""
        if CONFIG_FILE not in self.files:
            return f"{self.kind} config.json"
        return f"{self.kind} config.json {self.where(CONFIG_FILE)}"

    @cached_property
    def config(self):
        """config.json as a dict, or None when the checkpoint has none."""
        return self.json(CONFIG_FILE, f"{self.kind} config.json")

    def required_config(self) -> dict:
        """config.json, for weights that do not carry their own config (ModelNotFound when
        absent)."""
        if self.config is None:
            raise ModelNotFound(f"{self.label}: {self.kind} {self.format} weights but no "
                                f"{CONFIG_FILE}")
        return self.config

    @cached_property
    def generation_config(self):
        return self.json(GENERATION_CONFIG_FILE)

    @cached_property
    def chat_template(self):
        """The chat template: a GGUF's `tokenizer.chat_template`, else chat_template.jinja,
        else tokenizer_config.json's `chat_template` (a string; a list of named templates is
        not used); None when there is none."""
        if self.format == "gguf":
            template = self.metadata.get("tokenizer.chat_template")
            if isinstance(template, str):
                return template
        if CHAT_TEMPLATE_FILE in self.files:
            return self.text(CHAT_TEMPLATE_FILE)
        config = self.json(TOKENIZER_CONFIG_FILE)
        template = None if config is None else config.get("chat_template")
        return template if isinstance(template, str) else None

    # -- the tokenizer ----------------------------------------------------------------------
    @property
    def _gguf_vocabulary(self) -> bool:
        return self.format == "gguf" and "tokenizer.ggml.model" in self.metadata

    @property
    def has_tokenizer(self) -> bool:
        return (TOKENIZER_FILE in self.files or VOCAB_FILE in self.files
                or self._gguf_vocabulary)

    @cached_property
    def tokenizer(self):
        """The GGUF's own vocabulary when it has one (the ids its weights were trained on),
        else tokenizer.json, else a WordPiece vocab.txt; ModelNotFound when none."""
        from ..tokenizers import Tokenizer

        if self._gguf_vocabulary:
            return Tokenizer.from_gguf_metadata(self.metadata)
        if TOKENIZER_FILE in self.files:
            data = self._file(TOKENIZER_FILE)
            if isinstance(data, memoryview):
                return Tokenizer.from_bytes(data)
            return Tokenizer.from_file(data)
        if VOCAB_FILE in self.files:
            return self.wordpiece_tokenizer()
        raise ModelNotFound(f"{self.label}: no {TOKENIZER_FILE} (or {VOCAB_FILE}) next to the "
                            f"{self.kind} weights (found {', '.join(sorted(self.files))})")

    def wordpiece_tokenizer(self):
        """The WordPiece tokenizer that vocab.txt (one token a line, its id the line number)
        means, as HF's BertTokenizerFast builds it: BERT normalizer (lowercasing unless
        tokenizer_config.json says do_lower_case false), BERT pre-tokenizer, [CLS] A [SEP]."""
        from ..tokenizers import Tokenizer

        vocab = {}
        for index, token in enumerate((self.text(VOCAB_FILE) or "").splitlines()):
            vocab.setdefault(token.rstrip("\r"), index)
        config = self.json(TOKENIZER_CONFIG_FILE) or {}
        lowercase = config.get("do_lower_case", True) is not False
        missing = [token for token in ("[UNK]", "[CLS]", "[SEP]") if token not in vocab]
        if missing:
            raise ModelNotFound(f"{self.where(VOCAB_FILE)}: no {', '.join(missing)} token, not "
                                "a BERT vocabulary")
        added = [{"id": vocab[token], "content": token, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True}
                 for token in BERT_SPECIAL_TOKENS if token in vocab]
        return Tokenizer.from_str(json.dumps({
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "BertNormalizer", "clean_text": True,
                           "handle_chinese_chars": True, "strip_accents": None,
                           "lowercase": lowercase},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", vocab["[SEP]"]],
                               "cls": ["[CLS]", vocab["[CLS]"]]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": vocab}}))


def open_checkpoint(source, kind: str = "model", progress=None,
                    hub_files=DEFAULT_HUB_FILES) -> Checkpoint:
    """A Checkpoint from: a Checkpoint (as it is); {file name: bytes-like or path} (what a
    worker received); a local folder or file; a registry name (fetched and verified into the
    cache); or a Hub "org/name@revision" (`hub_files` fetched into the cache). `progress` sees
    downloads (hub.ProgressCallback)."""
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, dict):  # {file name: bytes}, e.g. what the browser worker received
        return Checkpoint(source, "the received files", kind)
    if not isinstance(source, (str, os.PathLike)):
        raise FormatError(f"{kind} checkpoint: expected a path, a registry name, a Hub "
                          f"'org/name@revision' or {{file name: bytes}}, got "
                          f"{type(source).__name__}")
    from .. import hub

    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_file():
        files = {item.name: item for item in sorted(path.parent.iterdir())
                 if item.name in SIDE_FILES and item.is_file()}
        files[path.name] = path
        return Checkpoint(files, str(path), kind)
    registry = hub.default_registry()
    if path.exists() or text in registry:
        return Checkpoint(hub.fetch_model(text, progress=progress, registry=registry),
                          str(path) if path.exists() else text, kind)
    spec = hub.HubSpec.parse(text)
    if spec is None:
        raise ModelNotFound(f"{text!r} is not a folder, a registry model or a Hub "
                            f"'org/name@revision' (registry models: {', '.join(registry.names())})")
    files = {name: hub.fetch_hf(spec.repo, spec.revision, name, progress=progress)
             for name in hub_files}
    return Checkpoint(files, str(spec), kind)


__all__ = ["Checkpoint", "open_checkpoint", "read_json_config", "weights_files",
           "DEFAULT_HUB_FILES", "SIDE_FILES", "CONFIG_FILE", "TOKENIZER_FILE"]
