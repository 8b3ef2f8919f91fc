"""The fields of /v1/embeddings: `input` as OpenAI takes it (a string, an array of strings, an
array of token ids, or an array of such arrays: token ids of the served model's own
vocabulary, as vLLM and llama-server read them), `dimensions`, and candle-web's `truncate`.

An input longer than the model's limit is refused with OpenAI's `context_length_exceeded`
unless the request asks for `"truncate": true` (Hugging Face text-embeddings-inference's name
for it): a vector of the first tokens only is not what a client asked for, and silently cutting
hid the loss (a 200 KB document embedded as its first 128 tokens).
"""

from __future__ import annotations

from . import validation as check
from .errors import bad_request


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value)


def inputs(body: dict, max_count: int, max_chars: int, vocab_size: int) -> list:
    """The inputs, each a non-empty string or a list of token ids (400 naming the bad one)."""
    value = body.get("input")
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request("input: expected a string, an array of strings, an array of token "
                          "ids or an array of token-id arrays, got "
                          f"{check.json_type_name(value)}", "input", "invalid_type")
    if len(value) > max_count:
        raise bad_request(f"input: at most {max_count} inputs, got {len(value)}", "input")
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if isinstance(item, str):
            if not item:
                raise bad_request(f"{where}: an empty string", where)
            if len(item) > max_chars:
                raise bad_request(f"{where}: longer than {max_chars} characters", where,
                                  "string_above_max_length")
        elif _is_ids(item):
            if len(item) > max_chars:
                raise bad_request(f"{where}: more than {max_chars} token ids", where,
                                  "array_above_max_length")
            bad = next((i for i in item if not 0 <= i < vocab_size), None)
            if bad is not None:
                raise bad_request(f"{where}: token id {bad} is outside this model's vocabulary "
                                  f"(0..{vocab_size - 1})", where)
        else:
            raise bad_request(f"{where}: expected a non-empty string or array of token ids, "
                              f"got {check.json_type_name(item)}", where, "invalid_type")
    return value


def check_dimensions(body: dict, model: str, size: int) -> None:
    """`dimensions` names the vector size; only the model's own can be given: shortening a
    vector keeps its meaning only for models trained for it (Matryoshka), and this is not
    one."""
    wanted = check.integer(body, "dimensions", minimum=1)
    if wanted is not None and wanted != size:
        raise bad_request(f"dimensions: {model} makes {size}-dimensional vectors and cannot "
                          f"shorten them to {wanted} (it was not trained for shortened "
                          f"vectors); leave dimensions out or send {size}", "dimensions",
                          "unsupported_value")


def tokenized(embedder, items: list, truncate: bool) -> list:
    """(ids with special tokens, truncated) per input, for SentenceEmbedder.embed_tokenized;
    an input over the model's limit is refused unless `truncate`."""
    out = []
    for index, item in enumerate(items):
        ids = list(embedder.tokenizer.encode(item).ids) if isinstance(item, str) \
            else embedder.with_special_tokens(item)
        if len(ids) > embedder.max_tokens and not truncate:
            raise bad_request(f"input[{index}]: this model's maximum context length is "
                              f"{embedder.max_tokens} tokens, however you requested {len(ids)} "
                              "tokens; send a shorter input, or \"truncate\": true to embed "
                              "its first tokens", f"input[{index}]", "context_length_exceeded")
        out.append(embedder.cut(ids))
    return out
