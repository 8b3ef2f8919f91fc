"""Load a model with its tokenizer: the one place the CLI, the worker sessions, the
benchmarks and the tests share. Every `load_*` takes what io/checkpoint.py opens (a registry
name, a local folder or file, a Hub "org/name@revision", received bytes, a Checkpoint) and
returns a `Loaded`: the model, its tokenizer and the checkpoint they came from. The tasks built
on the models live beside: text2text.py (T5: text in, text out), embed.py (BERT sentence
vectors), subtitles.py, transcribe.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import hub
from ..core.errors import ModelNotFound
from ..io.checkpoint import Checkpoint, open_checkpoint

DEFAULT_WHISPER = "whisper-tiny.en"
# What a Hub "org/name@revision" that the registry does not list must hold for Whisper: a
# faster-whisper CTranslate2 export (what the page loads too).
WHISPER_HUB_FILES = ("model.bin", "config.json", "tokenizer.json")


@dataclass(frozen=True)
class Loaded:
    """What every load_* returns. `checkpoint` (io/checkpoint.py) keeps what else the files
    hold: config, chat template, generation config, and where they came from. A task takes the
    first two: transcribe(loaded.model, loaded.tokenizer, audio), generate(...),
    T5TextGenerator(loaded.model, loaded.tokenizer), SentenceEmbedder(...)."""

    model: object
    tokenizer: object
    checkpoint: Checkpoint = None


def _loaded(model, checkpoint: Checkpoint) -> Loaded:
    """The model with the checkpoint's tokenizer, read after the model: a file the model
    refuses (an unsupported architecture) is named for that, not for a missing tokenizer."""
    return Loaded(model, checkpoint.tokenizer, checkpoint)


def model_folder(name_or_path, progress=None) -> Path:
    """The folder holding a model's files: fetched (and verified) for a registry name,
    as given for a local folder."""
    files = hub.fetch_model(str(name_or_path), progress=progress)
    folders = {path.parent for path in files.values()}
    if len(folders) != 1:
        raise ModelNotFound(f"{name_or_path}: files are spread over {len(folders)} folders")
    return folders.pop()


def load_whisper(name_or_path=DEFAULT_WHISPER, progress=None, device=None) -> Loaded:
    """Whisper from a registry name (e.g. 'whisper-tiny.en'), a folder with model.bin
    (CTranslate2) or model.safetensors (HF) plus config.json and tokenizer.json, or a Hub
    faster-whisper export "org/name@revision"."""
    from ..models.whisper import Whisper

    checkpoint = open_checkpoint(name_or_path, "whisper", progress, hub_files=WHISPER_HUB_FILES)
    return _loaded(Whisper.from_pretrained(checkpoint, device=device), checkpoint)


DEFAULT_VAD = "silero-vad"
VAD_FILE = "silero_vad_16k.safetensors"


def load_vad(name_or_path=DEFAULT_VAD, progress=None):
    """Silero VAD (models/silero_vad.py) from the registry ('silero-vad', fetched and
    verified) or a path to its safetensors file; one instance per source and process."""
    from ..models.silero_vad import SileroVad

    key = str(name_or_path)
    if key not in _VAD_MODELS:
        path = Path(key)
        if not path.is_file():
            path = hub.fetch(key, VAD_FILE, progress=progress)
        _VAD_MODELS[key] = SileroVad.load(str(path))
    return _VAD_MODELS[key]


_VAD_MODELS = {}


def load_llama(name_or_path, progress=None, device=None, mode: str = "auto") -> Loaded:
    """A LLaMA-family model from a registry name (e.g. 'smollm2-135m-instruct'), a .gguf
    file (tokenizer and chat template from its metadata) or an HF folder (config.json,
    *.safetensors, tokenizer.json). `mode` picks how quantized weights multiply
    (quantized/qmatmul.py)."""
    from ..models.llama import Llama

    checkpoint = open_checkpoint(name_or_path, "llama", progress)
    return _loaded(Llama.from_pretrained(checkpoint, device, mode), checkpoint)


# -- T5 and BERT ---------------------------------------------------------------------------
# No T5 weights exist in any package registry, so T5 comes from the Hub: the registry's
# "t5-small" (the default) and "flan-t5-small" are pinned to Hub commits (their weights by
# sha256, their config and tokenizer by the hash the Hub announces for that commit); any other
# "org/name@revision" works the same way, cached with a warning that no hash was known.
DEFAULT_T5 = "t5-small"
T5_HUB_FILES = ("config.json", "tokenizer.json", "model.safetensors")
T5_WITHOUT_THE_HUB = ("No offline mirror of T5 weights exists; pass a local folder with "
                      "config.json, model.safetensors and tokenizer.json (--model DIR)")
DEFAULT_BERT = "all-minilm-l6-v2"


def load_t5(name_or_path=DEFAULT_T5, progress=None, device=None, mode: str = "auto") -> Loaded:
    """T5 from a folder (config.json, *.safetensors or one .gguf, tokenizer.json), a registry
    name, or a Hub repo "org/name@revision"; wrap it as T5TextGenerator(model, tokenizer)."""
    from ..models.t5 import T5ForConditionalGeneration

    local = isinstance(name_or_path, (dict, Checkpoint)) or Path(
        str(name_or_path)).expanduser().exists()
    try:
        checkpoint = open_checkpoint(name_or_path, "t5", progress, hub_files=T5_HUB_FILES)
    except ModelNotFound as error:
        if local:
            raise
        raise ModelNotFound(f"T5 {error}. {T5_WITHOUT_THE_HUB}") from None
    return _loaded(T5ForConditionalGeneration.from_pretrained(checkpoint, device, mode),
                   checkpoint)


def bert_tokenizer_from_vocab(folder: Path):
    """The WordPiece tokenizer a folder's vocab.txt means (io/checkpoint.py builds it as HF's
    BertTokenizerFast does), whatever else the folder holds."""
    return open_checkpoint(Path(folder), "bert").wordpiece_tokenizer()


def load_bert(name_or_path=DEFAULT_BERT, progress=None, device=None) -> Loaded:
    """BERT from a registry name (e.g. 'all-minilm-l6-v2') or a folder (config.json,
    *.safetensors or pytorch_model.bin, tokenizer.json or a WordPiece vocab.txt); wrap it as
    SentenceEmbedder(model, tokenizer) for mean-pooled, L2-normalised sentence vectors."""
    from ..models.bert import BertModel

    checkpoint = open_checkpoint(name_or_path, "bert", progress)
    return _loaded(BertModel.from_pretrained(checkpoint, device), checkpoint)
