"""Grammar-constrained decoding: structured outputs (JSON object, JSON schema) and structural
tags (free text with JSON bodies between trigger strings, for tool calls).

One engine-neutral seam, two engines behind it: natively `xgrammar` (the `grammar` extra,
imported inside functions), in the page `@mlc-ai/web-xgrammar` through Pyodide (registered by
the worker with `register_engine`). Both take the same `Constraint` and `TokenVocabulary` and
fill the same bitmask, so a schema and a prompt give the same tokens in both places.

    constraint = Constraint.from_response_format(body["response_format"])   # None for "text"
    vocabulary = TokenVocabulary.from_tokenizer(tokenizer, vocab_size=config.vocab_size,
                                                stop_token_ids=eos_ids)
    row = GrammarRow(new_matcher(vocabulary, constraint))
    scores = row.mask(logits[row_index])      # disallowed tokens -> -inf, before sampling
    row.accept(token)                         # the sampled token moves the grammar on
    row.terminated                            # the grammar is complete (ends the row)

The bitmask is the layout both engines use: int32 words, ceil(vocab / 32) per row, bit i of
word w set = token 32 * w + i allowed. `apply_token_bitmask` is the one numpy masking step.

JSON-schema keywords that the engines accept but do not enforce (they would let a wrong answer
through with 200) are refused up front by `Constraint`, naming each one: `UnsupportedSchema`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import BackendUnavailable, CandleError, InvalidOption

KINDS = ("json_object", "json_schema", "structural_tag", "ebnf")
VOCAB_TYPES = ("raw", "byte_fallback", "byte_level")
BITS_PER_WORD = 32
# Compiled grammars kept per engine (least recently used dropped first): a server sees a few
# schemas again and again (one per client program), not thousands.
COMPILED_CACHE_SIZE = 64
# Schemas nest; a deeper one is a hostile request, not a data model.
MAX_SCHEMA_DEPTH = 64
# The longest run of whitespace allowed between JSON tokens: a newline and an indent 7 levels
# deep at 2 spaces (3 at 4) fits; a model that would pad for ever has to move on (SmolLM2's
# random-weight twin in the tests filled its whole context with spaces; at 32, SmolLM2-135M
# itself spent 128 tokens on newlines between "Quito"'s fields). Both engines take this bound.
MAX_WHITESPACE = 16
GRAMMAR_EXTRA_HINT = "structured outputs need the grammar extra: pip install 'candle-web[grammar]'"


class GrammarError(CandleError, ValueError):
    """A constraint that cannot be compiled or followed (bad schema, grammar dead end)."""


class UnsupportedSchema(GrammarError):
    """A JSON schema uses keywords the grammar engines cannot enforce; `features` lists
    them ("oneOf", "format: idn-email"...) and `paths` where each one is."""

    def __init__(self, features: list, paths: list):
        self.features, self.paths = list(features), list(paths)
        where = ", ".join(f"{feature} at {path}" for feature, path in zip(features, paths))
        super().__init__(f"the JSON schema uses features that constrained decoding cannot "
                         f"enforce: {where}")


# -- what a schema may use ----------------------------------------------------------------
# Keywords both engines enforce (checked against xgrammar 0.2.8: a string breaking each one
# is refused by the compiled grammar).
_ENFORCED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "unevaluatedItems", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minItems", "maxItems", "minProperties", "maxProperties",
    "patternProperties", "propertyNames"})
# Keywords that only annotate (no effect on validity), and OpenAI's own field.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "strict", "discriminator"})
# "format" values the engines check; others (idn-email, regex, ...) would be ignored.
_ENFORCED_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "uuid", "ipv4", "ipv6", "hostname",
    "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"})
# Keywords whose value is a map of name -> schema, or a list of schemas, or one schema.
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedItems", "propertyNames")
JSON_OBJECT = {"type": "object"}  # what response_format json_object asks for
_JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def unsupported_schema_features(schema) -> list:
    """[(feature, path)] for every keyword of `schema` that the engines would not enforce;
    empty when the schema is fully enforceable. Paths are JSON pointers ("#/properties/a")."""
    found = []
    _walk_schema(schema, "#", found, 0)
    return found


def _walk_schema(schema, path: str, found: list, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels at {path}")
    if isinstance(schema, bool):  # true: anything; false: nothing (both enforceable)
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"the JSON schema at {path} must be an object or a boolean, got "
                           f"{type(schema).__name__}")
    for key, value in schema.items():
        here = f"{path}/{key}"
        if key in _ANNOTATIONS:
            continue
        if key not in _ENFORCED_KEYWORDS:
            found.append((key, path))
            continue
        if key == "format" and value not in _ENFORCED_FORMATS:
            found.append((f"format: {value}", path))
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            found.append((f"$ref: {str(value)[:60]}", path))  # only '#/...' is followed
        elif key == "type":
            for name in value if isinstance(value, list) else [value]:
                if name not in _JSON_TYPES:
                    raise GrammarError(f"the JSON schema at {here}: {name!r} is not a JSON type "
                                       f"({', '.join(_JSON_TYPES)})")
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                raise GrammarError(f"the JSON schema at {here} must be an object")
            for name, child in value.items():
                _walk_schema(child, f"{here}/{name}", found, depth + 1)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise GrammarError(f"the JSON schema at {here} must be an array")
            for index, child in enumerate(value):
                _walk_schema(child, f"{here}/{index}", found, depth + 1)
        elif key in _SCHEMA_VALUES:
            _walk_schema(value, here, found, depth + 1)


# -- the constraint -------------------------------------------------------------------------
@dataclass(frozen=True)
class TagBody:
    """One structural tag: text `begin` (e.g. '<tool_call>'), then JSON matching `schema`,
    then `end` (e.g. '</tool_call>')."""
    begin: str
    schema: dict
    end: str


@dataclass(frozen=True, eq=False)
class Constraint:
    """What the output must be, independent of the engine.

    kind "json_object": any JSON object. "json_schema": JSON matching `schema` (`strict`: no
    properties or items beyond the schema's, as OpenAI's strict mode). "structural_tag": free
    text in which each trigger string (a prefix of some tag's begin) starts one of `tags`;
    `at_least_one`: the text must hold a tag (tool_choice "required"/named: the text begins
    with one); `stop_after_first`: the output ends after the first tag. "ebnf": `grammar` in
    the GBNF dialect both engines read. `max_whitespace`: the longest whitespace run between JSON
    tokens (json_object, json_schema)."""
    kind: str
    schema: dict = None
    strict: bool = False
    name: str = None
    tags: tuple = ()
    triggers: tuple = ()
    at_least_one: bool = False
    stop_after_first: bool = False
    grammar: str = None
    max_whitespace: int = MAX_WHITESPACE
    key: str = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise GrammarError(f"constraint kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "json_schema":
            _require_enforceable(self.schema)
        if self.kind == "structural_tag":
            if not self.tags or not self.triggers:
                raise GrammarError("a structural_tag constraint needs tags and triggers")
            for tag in self.tags:
                if not isinstance(tag, TagBody) or not tag.begin or not tag.end:
                    raise GrammarError("each structural tag needs a begin and an end string")
                if not any(tag.begin.startswith(trigger) for trigger in self.triggers):
                    raise GrammarError(f"structural tag {tag.begin!r} starts with no trigger "
                                       f"({', '.join(map(repr, self.triggers))})")
                _require_enforceable(tag.schema)
        if self.kind == "ebnf" and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise GrammarError("an ebnf constraint needs a grammar string")
        # The cache key: the constraint's whole meaning in canonical JSON.
        object.__setattr__(self, "key", json.dumps(self.describe(), sort_keys=True))

    # Equal and hashable by meaning (the schema dicts themselves are not hashable), so options
    # that hold a constraint stay comparable and hashable.
    def __eq__(self, other):
        return isinstance(other, Constraint) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def describe(self) -> dict:
        """The constraint as plain JSON (what the page's engine receives through Pyodide)."""
        return {"kind": self.kind, "schema": self.schema, "strict": self.strict,
                "tags": [{"begin": t.begin, "schema": t.schema, "end": t.end} for t in self.tags],
                "triggers": list(self.triggers), "at_least_one": self.at_least_one,
                "stop_after_first": self.stop_after_first, "grammar": self.grammar,
                "max_whitespace": self.max_whitespace}

    @staticmethod
    def json_object() -> "Constraint":
        return Constraint("json_object")

    @staticmethod
    def json_schema(schema: dict, strict: bool = False, name: str = None) -> "Constraint":
        return Constraint("json_schema", schema=schema, strict=bool(strict), name=name)

    @staticmethod
    def structural_tag(tags, triggers, at_least_one: bool = False,
                       stop_after_first: bool = False) -> "Constraint":
        return Constraint("structural_tag", tags=tuple(tags), triggers=tuple(triggers),
                          at_least_one=at_least_one, stop_after_first=stop_after_first)

    @staticmethod
    def from_response_format(value, param: str = "response_format"):
        """OpenAI's `response_format` -> a Constraint, or None for {"type": "text"} / absent.
        Errors are GrammarError naming the field: `param.type`, `param.json_schema.schema`..."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _field_error(param, f"expected an object, got {type(value).__name__}")
        kind = value.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return Constraint.json_object()
        if kind != "json_schema":
            raise _field_error(f"{param}.type", f"{str(kind)[:40]!r} is not one of text, "
                                                f"json_object, json_schema")
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise _field_error(f"{param}.json_schema", "expected an object with name and schema")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise _field_error(f"{param}.json_schema.name", "a required string is missing")
        strict = spec.get("strict", False)
        if strict is not None and not isinstance(strict, bool):
            raise _field_error(f"{param}.json_schema.strict", "expected a boolean")
        schema = spec.get("schema", {"type": "object"})  # OpenAI: absent means any object
        if not isinstance(schema, dict):
            raise _field_error(f"{param}.json_schema.schema", "expected an object")
        try:
            return Constraint.json_schema(schema, bool(strict), name)
        except UnsupportedSchema as error:
            error.param = f"{param}.json_schema.schema"
            raise
        except GrammarError as error:
            raise _field_error(f"{param}.json_schema.schema", str(error)) from None


def _field_error(param: str, message: str) -> GrammarError:
    error = GrammarError(f"{param}: {message}")
    error.param = param
    return error


def _require_enforceable(schema) -> None:
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    found = unsupported_schema_features(schema)
    if found:
        raise UnsupportedSchema([feature for feature, _ in found], [path for _, path in found])


# -- the vocabulary ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenVocabulary:
    """What an engine needs of a tokenizer: `encoded_vocab[id]` as the tokenizer file stores it
    (byte-level 'Ġ' forms, '▁' and '<0x0A>' forms; '' for ids the tokenizer lacks),
    `vocab_type` (raw / byte_fallback / byte_level), `vocab_size` as the model's logits see it
    (may exceed the tokenizer's), the `stop_token_ids` that end an answer, and
    `add_prefix_space` (a SentencePiece tokenizer puts a space before the text)."""
    encoded_vocab: tuple
    vocab_type: str
    vocab_size: int
    stop_token_ids: tuple
    add_prefix_space: bool = False
    fingerprint: str = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.vocab_type not in VOCAB_TYPES:
            raise GrammarError(f"vocab_type {self.vocab_type!r} is not one of {VOCAB_TYPES}")
        if not self.stop_token_ids:
            raise GrammarError("a grammar needs at least one stop token id")
        digest = hashlib.sha256()
        digest.update(json.dumps([self.vocab_type, self.vocab_size, list(self.stop_token_ids),
                                  self.add_prefix_space]).encode())
        digest.update("\0".join(self.encoded_vocab).encode("utf-8", "surrogatepass"))
        object.__setattr__(self, "fingerprint", digest.hexdigest())

    @property
    def bitmask_words(self) -> int:
        return bitmask_words(self.vocab_size)

    @staticmethod
    def from_tokenizer(tokenizer, vocab_size: int = None, stop_token_ids=()) -> "TokenVocabulary":
        """From a candle-web `Tokenizer` (tokenizer.json or GGUF); `vocab_size`: the model's
        logits width (default: the tokenizer's). Cached per tokenizer object and arguments."""
        stops = tuple(sorted({int(i) for i in stop_token_ids}))
        try:
            per_tokenizer = _VOCABULARIES.setdefault(tokenizer, {})
        except TypeError:  # not weak-referenceable: build every time
            per_tokenizer = {}
        key = (vocab_size, stops)
        if key not in per_tokenizer:
            per_tokenizer[key] = _vocabulary_of(tokenizer, vocab_size, stops)
        return per_tokenizer[key]


_VOCABULARIES = weakref.WeakKeyDictionary()


def _vocabulary_of(tokenizer, vocab_size, stops) -> TokenVocabulary:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    size = max(max(vocab.values()) + 1, len(vocab))
    size = int(vocab_size) if vocab_size else size
    encoded = [""] * size
    for token, index in vocab.items():
        if index < size:
            encoded[index] = token
    vocab_type, prefix_space = _vocab_type(tokenizer)
    return TokenVocabulary(tuple(encoded), vocab_type, size, stops, prefix_space)


def _vocab_type(tokenizer) -> tuple:
    """(vocab type, add_prefix_space) from the decoder, as xgrammar's own detection reads a
    tokenizer.json: a ByteLevel decoder means byte-level tokens, a ByteFallback one means
    '<0xNN>' tokens for bytes and '▁' for spaces."""
    from ..tokenizers import decoders

    chain = [tokenizer.decoder]
    flat = []
    while chain:
        item = chain.pop(0)
        if isinstance(item, decoders.Sequence):
            chain = list(item.decoders) + chain
        elif item is not None:
            flat.append(item)
    if any(isinstance(item, decoders.ByteLevel) for item in flat):
        return "byte_level", False
    if any(isinstance(item, decoders.ByteFallback) for item in flat):
        strips_space = any(isinstance(item, decoders.Strip) for item in flat)
        return "byte_fallback", strips_space
    metaspace = [item for item in flat if isinstance(item, decoders.Metaspace)]
    if metaspace:
        return "byte_fallback", metaspace[0].prepend_scheme != "never"
    return "raw", False


# -- bitmasks ---------------------------------------------------------------------------------
def bitmask_words(vocab_size: int) -> int:
    return (int(vocab_size) + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_token_bitmask(rows: int, vocab_size: int) -> np.ndarray:
    """[rows, words] int32, every token allowed (all bits set)."""
    return np.full((rows, bitmask_words(vocab_size)), -1, dtype=np.int32)


def allowed_tokens(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Boolean [vocab_size] of one row's bitmask (little-endian bit order within each word)."""
    words = np.ascontiguousarray(bitmask, dtype="<i4").reshape(-1)
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """A copy of `logits` [vocab] with disallowed tokens at -inf; tokens past the bitmask
    (a logits row wider than the vocabulary) are disallowed too."""
    logits = np.asarray(logits)
    allowed = allowed_tokens(bitmask, min(logits.shape[-1], bitmask.size * BITS_PER_WORD))
    masked = np.full(logits.shape, -np.inf, dtype=logits.dtype)
    masked[..., :allowed.size] = np.where(allowed, logits[..., :allowed.size], -np.inf)
    return masked


# -- matchers and engines ---------------------------------------------------------------------
class Matcher:
    """One request row's grammar state. Engines implement these four."""

    def fill_next_token_bitmask(self, bitmask: np.ndarray) -> None:
        """Write the allowed next tokens into `bitmask` [words] int32."""
        raise NotImplementedError

    def accept_token(self, token_id: int) -> bool:
        """Move on by one token; False if the grammar does not allow it (state unchanged)."""
        raise NotImplementedError

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted."""
        raise NotImplementedError

    def rollback(self, n_tokens: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class GrammarEngine:
    """Compiles constraints for a vocabulary and makes matchers. `compile` results are cached
    here per (vocabulary, constraint)."""

    name = "engine"

    def __init__(self):
        self._compiled = OrderedDict()
        self._lock = threading.Lock()

    def compiled(self, vocabulary: TokenVocabulary, constraint: Constraint):
        key = (vocabulary.fingerprint, constraint.key)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        grammar = self.compile(vocabulary, constraint)  # outside the lock: may take a while
        with self._lock:
            self._compiled[key] = grammar
            while len(self._compiled) > COMPILED_CACHE_SIZE:
                self._compiled.popitem(last=False)
        return grammar

    def compile(self, vocabulary: TokenVocabulary, constraint: Constraint):
        raise NotImplementedError

    def matcher(self, compiled) -> Matcher:
        raise NotImplementedError


_ENGINES = {}
_DEFAULT_ENGINE = ["xgrammar"]


def register_engine(name: str, factory, default: bool = False) -> None:
    """`factory()` -> GrammarEngine, built on first use. The page registers its web-xgrammar
    engine with default=True."""
    _ENGINES[name] = [factory, None]
    if default:
        _DEFAULT_ENGINE[0] = name


def get_engine(name: str = None) -> GrammarEngine:
    name = name or _DEFAULT_ENGINE[0]
    if name not in _ENGINES:
        raise InvalidOption(f"grammar engine {name!r} is not registered "
                            f"(known: {', '.join(sorted(_ENGINES))})")
    entry = _ENGINES[name]
    if entry[1] is None:
        entry[1] = entry[0]()
    return entry[1]


def new_matcher(vocabulary: TokenVocabulary, constraint: Constraint,
                engine: str = None) -> Matcher:
    engine = get_engine(engine)
    return engine.matcher(engine.compiled(vocabulary, constraint))


def grammar_row(tokenizer, constraint: Constraint, vocab_size: int, stop_token_ids,
                engine: str = None) -> "GrammarRow":
    """A fresh GrammarRow for one sequence of a model with `vocab_size` logits whose answers
    end at `stop_token_ids`; the compiled grammar is cached, so only the first call for a
    (tokenizer, constraint) pays the compile (the API calls this off the scheduler thread
    first, so a bad schema is a 400 before the request queues)."""
    vocabulary = TokenVocabulary.from_tokenizer(tokenizer, vocab_size, stop_token_ids)
    return GrammarRow(new_matcher(vocabulary, constraint, engine), vocab_size)


class GrammarRow:
    """A request row under a grammar, as a decode loop uses it: `mask(scores)` before
    sampling, `accept(token)` after; `terminated` once the grammar is complete."""

    def __init__(self, matcher: Matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = int(vocab_size)
        self.bitmask = np.empty(bitmask_words(vocab_size), dtype=np.int32)

    def mask(self, scores: np.ndarray) -> np.ndarray:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        masked = apply_token_bitmask(scores, self.bitmask)
        if not np.isfinite(masked).any():
            raise GrammarError("the grammar allows no next token the model can produce")
        return masked

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(int(token_id)):
            raise GrammarError(f"the grammar refused token {int(token_id)}, which its own mask "
                               f"allowed")

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


# -- the native engine: xgrammar ----------------------------------------------------------------
class XGrammarEngine(GrammarEngine):
    name = "xgrammar"

    def __init__(self):
        super().__init__()
        self.xgrammar = _import_xgrammar()
        self._compilers = {}

    def _compiler(self, vocabulary: TokenVocabulary):
        xg = self.xgrammar
        compiler = self._compilers.get(vocabulary.fingerprint)
        if compiler is None:
            vocab_type = {"raw": xg.VocabType.RAW, "byte_fallback": xg.VocabType.BYTE_FALLBACK,
                          "byte_level": xg.VocabType.BYTE_LEVEL}[vocabulary.vocab_type]
            info = xg.TokenizerInfo(list(vocabulary.encoded_vocab), vocab_type,
                                    vocab_size=vocabulary.vocab_size,
                                    stop_token_ids=list(vocabulary.stop_token_ids),
                                    add_prefix_space=vocabulary.add_prefix_space)
            compiler = self._compilers[vocabulary.fingerprint] = xg.GrammarCompiler(info)
        return compiler

    def compile(self, vocabulary: TokenVocabulary, constraint: Constraint):
        compiler = self._compiler(vocabulary)
        try:
            if constraint.kind in ("json_object", "json_schema"):
                # json_object: an object (xgrammar's builtin JSON grammar takes any value).
                schema = constraint.schema if constraint.kind == "json_schema" else JSON_OBJECT
                return compiler.compile_json_schema(
                    json.dumps(schema), strict_mode=constraint.strict,
                    max_whitespace_cnt=constraint.max_whitespace)
            if constraint.kind == "ebnf":
                return compiler.compile_grammar(constraint.grammar)
            return compiler.compile_structural_tag(_xgrammar_structural_tag(constraint))
        except (RuntimeError, ValueError) as error:  # xgrammar's refusals of a schema/grammar
            raise GrammarError(f"the {constraint.kind} constraint cannot be compiled: "
                               f"{_engine_message(error)}") from None

    def matcher(self, compiled) -> Matcher:
        return _XGrammarMatcher(self.xgrammar.GrammarMatcher(compiled))


def _xgrammar_structural_tag(constraint: Constraint) -> str:
    tags = [{"type": "tag", "begin": tag.begin, "end": tag.end,
             "content": {"type": "json_schema", "json_schema": tag.schema}}
            for tag in constraint.tags]
    return json.dumps({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": list(constraint.triggers), "tags": tags,
        "at_least_one": constraint.at_least_one,
        "stop_after_first": constraint.stop_after_first}})


def _engine_message(error: BaseException) -> str:
    """xgrammar's C++ messages start with '[time] file.cc:line: '; keep what follows."""
    text = str(error).strip()
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


class _XGrammarMatcher(Matcher):
    def __init__(self, matcher):
        self._matcher = matcher

    def fill_next_token_bitmask(self, bitmask: np.ndarray) -> None:
        self._matcher.fill_next_token_bitmask(bitmask.reshape(1, -1))

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.accept_token(int(token_id))

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def rollback(self, n_tokens: int) -> None:
        self._matcher.rollback(int(n_tokens))

    def reset(self) -> None:
        self._matcher.reset()


def _import_xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise BackendUnavailable(GRAMMAR_EXTRA_HINT) from None
    return xgrammar


register_engine("xgrammar", XGrammarEngine)
