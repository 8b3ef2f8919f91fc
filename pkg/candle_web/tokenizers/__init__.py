"""HF `tokenizer.json` tokenizers in pure Python (BPE, Unigram, WordPiece) and GGUF vocabularies.

    from candle_web.tokenizers import Tokenizer
    tok = Tokenizer.from_file("tokenizer.json")
    ids = tok.encode("Hello world").ids
    text = tok.decode(ids)
"""

from .added_vocabulary import AddedToken
from .encoding import Encoding, PaddingParams, TruncationParams
from .tokenizer import Tokenizer

__all__ = ["Tokenizer", "Encoding", "AddedToken", "PaddingParams", "TruncationParams"]
