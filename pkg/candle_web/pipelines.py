"""Load a model with its tokenizer from a registry name or a local folder: the one place the
CLI, the benchmarks and the tests share."""

from __future__ import annotations

from pathlib import Path

from . import hub
from .errors import ModelNotFound

DEFAULT_WHISPER = "whisper-tiny.en"


def model_folder(name_or_path, progress=None) -> Path:
    """The folder holding a model's files: fetched (and verified) for a registry name,
    as given for a local folder."""
    files = hub.fetch_model(str(name_or_path), progress=progress)
    folders = {path.parent for path in files.values()}
    if len(folders) != 1:
        raise ModelNotFound(f"{name_or_path}: files are spread over {len(folders)} folders")
    return folders.pop()


def load_whisper(name_or_path=DEFAULT_WHISPER, progress=None, device=None):
    """(Whisper model, Tokenizer) from a registry name (e.g. 'whisper-tiny.en') or a folder
    with model.bin (CTranslate2) or model.safetensors (HF) plus config.json and tokenizer.json."""
    from .models.whisper import Whisper
    from .tokenizers import Tokenizer

    folder = model_folder(name_or_path, progress)
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise ModelNotFound(f"{folder}: no tokenizer.json next to the Whisper weights")
    model = Whisper.from_pretrained(folder, device=device)
    return model, Tokenizer.from_file(str(tokenizer_path))


def load_llama(name_or_path, progress=None, device=None, mode: str = "auto"):
    """(Llama model, Tokenizer) from a registry name (e.g. 'smollm2-135m-instruct'), a .gguf
    file (tokenizer from its metadata) or an HF folder (config.json, *.safetensors,
    tokenizer.json). `mode` picks how quantized weights multiply (quantized/qmatmul.py)."""
    from .io.gguf import GgufFile
    from .models.llama import Llama
    from .tokenizers import Tokenizer

    files = hub.fetch_model(str(name_or_path), progress=progress)
    ggufs = [path for name, path in files.items() if name.endswith(".gguf")]
    if len(ggufs) == 1:
        gguf = GgufFile(ggufs[0])
        return Llama.from_gguf(gguf, device, mode), Tokenizer.from_gguf_metadata(gguf.metadata)
    folder = model_folder(name_or_path, progress)
    tokenizer_path = folder / "tokenizer.json"
    if len(ggufs) > 1 or not tokenizer_path.exists():
        raise ModelNotFound(f"{name_or_path}: expected one .gguf file, or config.json + "
                            f"*.safetensors + tokenizer.json (found {sorted(files)})")
    return Llama.from_pretrained(folder, device, mode), Tokenizer.from_file(str(tokenizer_path))
