"""Load a model with its tokenizer from a registry name or a local folder: the one place the
CLI, the benchmarks and the tests share. The tasks built on the models live beside:
text2text.py (T5: text in, text out), embed.py (BERT sentence vectors), subtitles.py."""

from __future__ import annotations

from pathlib import Path

from .. import hub
from ..core.errors import ModelNotFound

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
    from ..models.whisper import Whisper
    from ..tokenizers import Tokenizer

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
    from ..io.gguf import GgufFile
    from ..models.llama import Llama
    from ..tokenizers import Tokenizer

    files = hub.fetch_model(str(name_or_path), progress=progress)
    ggufs = [path for name, path in files.items() if name.endswith(".gguf")]
    if len(ggufs) == 1:
        gguf = GgufFile(ggufs[0])
        return (Llama.load(gguf, device=device, mode=mode),
                Tokenizer.from_gguf_metadata(gguf.metadata))
    folder = model_folder(name_or_path, progress)
    tokenizer_path = folder / "tokenizer.json"
    if len(ggufs) > 1 or not tokenizer_path.exists():
        raise ModelNotFound(f"{name_or_path}: expected one .gguf file, or config.json + "
                            f"*.safetensors + tokenizer.json (found {sorted(files)})")
    return Llama.from_pretrained(folder, device, mode), Tokenizer.from_file(str(tokenizer_path))


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


def _hub_repo_spec(name: str):
    """("org/name", revision) for "org/name@revision" ("main" when no revision), else None."""
    import re

    match = re.fullmatch(r"([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@([\w.-]+))?", name)
    if match is None:
        return None
    return match.group(1), match.group(2) or "main"


def _t5_folder(name_or_path, progress=None) -> Path:
    """A local folder, a registry name, or a Hub "org/name@revision" fetched into the cache."""
    text = str(name_or_path)
    if Path(text).expanduser().exists():
        return model_folder(text, progress)
    if text in hub.default_registry():
        try:
            return model_folder(text, progress)
        except ModelNotFound as error:
            raise ModelNotFound(f"T5 {error}. {T5_WITHOUT_THE_HUB}") from None
    spec = _hub_repo_spec(text)
    if spec is None:
        raise ModelNotFound(f"{text!r} is not a folder, a registry model or a Hub 'org/name@revision'")
    repo, revision = spec
    try:
        paths = [hub.fetch_hf(repo, revision, name, progress=progress) for name in T5_HUB_FILES]
    except ModelNotFound as error:
        raise ModelNotFound(f"T5 {repo}@{revision}: {error}. {T5_WITHOUT_THE_HUB}") from None
    return paths[0].parent


def load_t5(name_or_path=DEFAULT_T5, progress=None, device=None, mode: str = "auto"):
    """A T5TextGenerator (model + tokenizer) from a folder (config.json, *.safetensors or one
    .gguf, tokenizer.json), a registry name, or a Hub repo "org/name@revision"."""
    from ..models.t5 import T5ForConditionalGeneration
    from ..tokenizers import Tokenizer
    from .text2text import T5TextGenerator

    folder = _t5_folder(name_or_path, progress)
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise ModelNotFound(f"{folder}: no tokenizer.json next to the T5 weights")
    model = T5ForConditionalGeneration.from_pretrained(folder, device, mode)
    return T5TextGenerator(model, Tokenizer.from_file(str(tokenizer_path)))


BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bert_tokenizer_from_vocab(folder: Path):
    """The WordPiece tokenizer a folder with only vocab.txt (one token a line, its id the line
    number) means, as HF's BertTokenizerFast builds it: BERT normalizer (lowercasing unless
    tokenizer_config.json says do_lower_case false), BERT pre-tokenizer, [CLS] A [SEP]."""
    import json

    from ..models.config_fields import read_json_config
    from ..tokenizers import Tokenizer

    vocab = {}
    for index, token in enumerate((folder / "vocab.txt").read_text(encoding="utf-8")
                                  .splitlines()):
        vocab.setdefault(token.rstrip("\r"), index)
    config_path = folder / "tokenizer_config.json"
    config = read_json_config(config_path, "tokenizer_config.json") if config_path.exists() else {}
    lowercase = config.get("do_lower_case", True) is not False
    missing = [token for token in ("[UNK]", "[CLS]", "[SEP]") if token not in vocab]
    if missing:
        raise ModelNotFound(f"{folder / 'vocab.txt'}: no {', '.join(missing)} token, not a "
                            "BERT vocabulary")
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


def load_bert(name_or_path=DEFAULT_BERT, progress=None, device=None):
    """A SentenceEmbedder (BERT + tokenizer, mean pooling, L2 normalisation) from a registry
    name (e.g. 'all-minilm-l6-v2') or a folder (config.json, *.safetensors or
    pytorch_model.bin, tokenizer.json or a WordPiece vocab.txt)."""
    from ..models.bert import BertModel
    from ..tokenizers import Tokenizer
    from .embed import SentenceEmbedder

    folder = model_folder(name_or_path, progress)
    tokenizer_path = folder / "tokenizer.json"
    if tokenizer_path.exists():
        tokenizer = Tokenizer.from_file(tokenizer_path)
    elif (folder / "vocab.txt").exists():
        tokenizer = bert_tokenizer_from_vocab(folder)
    else:
        raise ModelNotFound(f"{folder}: no tokenizer.json (or vocab.txt) next to the BERT "
                            "weights")
    return SentenceEmbedder(BertModel.from_pretrained(folder, device), tokenizer)
