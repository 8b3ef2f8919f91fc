"""The same `Tokenizer` API on top of HF `tokenizers` (native only, when it is installed).

Never imported at module level by the package: Pyodide has no HF `tokenizers`.
"""

from __future__ import annotations

from ..core.errors import BackendUnavailable, FormatError, check_text
from .encoding import Encoding


def hf_available() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def _to_encoding(hf_encoding) -> Encoding:
    return Encoding(ids=list(hf_encoding.ids), tokens=list(hf_encoding.tokens),
                    type_ids=list(hf_encoding.type_ids),
                    attention_mask=list(hf_encoding.attention_mask),
                    special_tokens_mask=list(hf_encoding.special_tokens_mask))


class HFTokenizer:
    """Delegates to `tokenizers.Tokenizer`; returns this package's `Encoding`."""

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def from_str(cls, text: str) -> "HFTokenizer":
        try:
            import tokenizers
        except ImportError:
            raise BackendUnavailable("tokenizer backend 'hf' needs the package `tokenizers` "
                                     "(pip install tokenizers)") from None
        try:
            return cls(tokenizers.Tokenizer.from_str(text))
        except Exception as exc:  # HF raises a plain Exception for malformed files
            raise FormatError(f"tokenizer.json rejected by HF tokenizers: {exc}") from None

    def encode(self, text, pair=None, add_special_tokens=True) -> Encoding:
        # HF raises TypeError("TextInputSequence must be str") on a lone surrogate: the same
        # InvalidText as the Python backend instead.
        if isinstance(text, str):
            check_text(text, "encode: text")
        if isinstance(pair, str):
            check_text(pair, "encode: pair")
        return _to_encoding(self.inner.encode(text, pair, add_special_tokens=add_special_tokens))

    def encode_pair(self, text, pair, add_special_tokens=True) -> Encoding:
        return self.encode(text, pair, add_special_tokens)

    def encode_batch(self, inputs, add_special_tokens=True) -> list:
        items = [tuple(item) if isinstance(item, (tuple, list)) else item for item in inputs]
        for item in items:
            for text in (item if isinstance(item, tuple) else (item,)):
                if isinstance(text, str):
                    check_text(text, "encode: text")
        return [_to_encoding(encoding) for encoding in
                self.inner.encode_batch(items, add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens=True) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch, skip_special_tokens=True) -> list:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def token_to_id(self, token):
        return self.inner.token_to_id(token)

    def id_to_token(self, token_id):
        return self.inner.id_to_token(token_id)

    def get_vocab_size(self, with_added_tokens=True) -> int:
        return self.inner.get_vocab_size(with_added_tokens=with_added_tokens)

    def get_vocab(self, with_added_tokens=True) -> dict:
        return self.inner.get_vocab(with_added_tokens=with_added_tokens)

    def no_padding(self):
        self.inner.no_padding()

    def no_truncation(self):
        self.inner.no_truncation()

    def enable_padding(self, **kwargs):
        self.inner.enable_padding(**kwargs)

    def enable_truncation(self, max_length, **kwargs):
        self.inner.enable_truncation(max_length, **kwargs)
