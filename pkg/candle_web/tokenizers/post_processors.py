"""Post-processors of the HF tokenizer.json format: add special tokens and set type ids."""

from __future__ import annotations

from ..core.errors import FormatError, UnsupportedError
from .encoding import Encoding
from .fields import (SOURCE, Fields, as_int, as_list, as_object, as_string, check_nesting,
                     describe, sequence_steps)

SEQUENCE_NAMES = ("A", "B")


class PostProcessor:
    def added_tokens(self, is_pair: bool) -> int:
        return 0

    def process(self, first: Encoding, second, add_special_tokens: bool) -> Encoding:
        """Merge one or two encodings into the final one (HF PostProcessor::process)."""
        first.set_type_ids(0)
        if second is not None:
            second.set_type_ids(1)
        parts = self.process_encodings([first] if second is None else [first, second],
                                       add_special_tokens)
        merged = Encoding()
        for part in parts:
            merged.extend(part)
        return merged

    def process_encodings(self, encodings: list, add_special_tokens: bool) -> list:
        return encodings


def _special(token: str, token_id: int, type_id: int) -> Encoding:
    return Encoding.from_tokens([(token_id, token)], type_id=type_id, special=True)


class TemplateProcessing(PostProcessor):
    """`single` / `pair`: [(kind, name, type id)] with kind "sequence" (name "A" or "B") or
    "special" (name a key of `special_tokens`: name -> (ids, tokens))."""

    def __init__(self, single: list, pair: list, special_tokens: dict,
                 where: str = "post_processor"):
        self.single = single
        self.pair = pair
        self.special_tokens = special_tokens
        for template_name, template in (("single", single), ("pair", pair)):
            for index, (kind, name, _) in enumerate(template):
                _check_piece(kind, name, special_tokens, template_name == "single",
                             f"{where}.{template_name}[{index}]")

    def added_tokens(self, is_pair):
        template = self.pair if is_pair else self.single
        return sum(len(self.special_tokens[name][0]) for kind, name, _ in template
                   if kind == "special")

    def process_encodings(self, encodings, add_special_tokens):
        template = self.pair if len(encodings) == 2 else self.single
        result = []
        for kind, name, type_id in template:
            if kind == "sequence":
                encoding = encodings[SEQUENCE_NAMES.index(name)]
                encoding.set_type_ids(type_id)
                result.append(encoding)
            elif add_special_tokens:
                ids, tokens = self.special_tokens[name]
                result.append(Encoding(ids=list(ids), tokens=list(tokens),
                                       type_ids=[type_id] * len(ids),
                                       attention_mask=[1] * len(ids),
                                       special_tokens_mask=[1] * len(ids)))
        return result

    @classmethod
    def from_config(cls, config: dict, where: str) -> "TemplateProcessing":
        fields = Fields(config, where)
        special_tokens = _special_tokens(fields.object("special_tokens", {}),
                                         fields.path("special_tokens"))
        single = parse_template(fields.get("single", []), fields.path("single"))
        pair = parse_template(fields.get("pair", []), fields.path("pair"))
        return cls(single, pair, special_tokens, where)


def _check_piece(kind: str, name: str, special_tokens: dict, single: bool, where: str):
    """A template piece must refer to something that exists when it is applied: checked at
    load so that encode cannot fail on it."""
    if kind == "special" and name not in special_tokens:
        raise FormatError(f"{SOURCE} {where}: template uses special token {describe(name)} "
                          f"missing from special_tokens")
    if kind == "sequence" and name not in SEQUENCE_NAMES[:1 if single else 2]:
        allowed = "A" if single else "A or B"
        raise FormatError(f"{SOURCE} {where}: sequence {describe(name)} in the "
                          f"{'single' if single else 'pair'} template (expected {allowed})")


def _special_tokens(config: dict, where: str) -> dict:
    """name -> (ids, tokens), both lists of the same length."""
    special_tokens = {}
    for name, entry in config.items():
        entry_where = f"{where}[{describe(name)}]"
        entry = Fields(entry, entry_where)
        ids = [as_int(token_id, f"{entry_where}.ids[{index}]")
               for index, token_id in enumerate(entry.list("ids"))]
        tokens = [as_string(token, f"{entry_where}.tokens[{index}]")
                  for index, token in enumerate(entry.list("tokens"))]
        if len(ids) != len(tokens):
            raise FormatError(f"{SOURCE} {entry_where}: {len(ids)} ids for {len(tokens)} "
                              f"tokens (they must pair up)")
        special_tokens[name] = (ids, tokens)
    return special_tokens


def parse_template(pieces, where: str) -> list:
    """A template: a string like "[CLS] $A [SEP]" or a list of piece objects."""
    if isinstance(pieces, str):
        return [parse_piece_string(piece, f"{where}[{index}]")
                for index, piece in enumerate(pieces.split())]
    return [_parse_piece_object(piece, f"{where}[{index}]")
            for index, piece in enumerate(as_list(pieces, where))]


def _parse_piece_object(piece, where: str) -> tuple:
    """{"Sequence": {"id": "A", "type_id": 0}} or {"SpecialToken": {"id": "[CLS]", ...}}."""
    as_object(piece, where)
    if len(piece) != 1 or next(iter(piece)) not in ("Sequence", "SpecialToken"):
        raise FormatError(f"{SOURCE} {where}: expected {{\"Sequence\": ...}} or "
                          f"{{\"SpecialToken\": ...}}, got {describe(piece)}")
    (kind, body), = piece.items()
    fields = Fields(body, f"{where}.{kind}")
    if kind == "Sequence":
        return ("sequence", fields.choice("id", SEQUENCE_NAMES), fields.integer("type_id", 0))
    return ("special", fields.string("id"), fields.integer("type_id", 0))


def parse_piece_string(piece: str, where: str = "post_processor"):
    """Template strings like "$A", "$B:1", "$0" (type id 0 for A), "[CLS]", "[SEP]:1"."""
    name, colon, type_text = piece.partition(":")
    type_id = _type_id_text(type_text, where) if colon else 0
    if not name.startswith("$"):
        return ("special", name, type_id)
    sequence = name[1:]
    if sequence in ("", "A", "a"):
        return ("sequence", "A", type_id)
    if sequence in ("B", "b"):
        return ("sequence", "B", type_id)
    if sequence.isascii() and sequence.isdigit():
        # "$0" / "$1" are the type-id shorthand for sequence A (an explicit ":n" wins).
        return ("sequence", "A", type_id if colon else _type_id_text(sequence, where))
    raise FormatError(f"{SOURCE} {where}: unknown sequence {describe(name)} in template "
                      f"piece {describe(piece)} (expected $A or $B)")


def _type_id_text(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise FormatError(f"{SOURCE} {where}: type id {describe(text)} is not a "
                          f"non-negative integer")
    return as_int(int(text), where)


class BertProcessing(PostProcessor):
    def __init__(self, sep: tuple, cls_: tuple):
        self.sep = sep  # (token, id)
        self.cls = cls_

    def added_tokens(self, is_pair):
        return 3 if is_pair else 2

    def process_encodings(self, encodings, add_special_tokens):
        if not add_special_tokens:
            return encodings
        first = encodings[0]
        result = [_special(self.cls[0], self.cls[1], 0), first,
                  _special(self.sep[0], self.sep[1], 0)]
        if len(encodings) == 2:
            second = encodings[1]
            second.set_type_ids(1)
            result += [second, _special(self.sep[0], self.sep[1], 1)]
        return result


class RobertaProcessing(PostProcessor):
    def __init__(self, sep: tuple, cls_: tuple):
        self.sep = sep
        self.cls = cls_

    def added_tokens(self, is_pair):
        return 4 if is_pair else 2

    def process_encodings(self, encodings, add_special_tokens):
        # RoBERTa uses type id 0 everywhere (offset trimming is not modelled: no offsets).
        for encoding in encodings:
            encoding.set_type_ids(0)
        if not add_special_tokens:
            return encodings
        result = [_special(self.cls[0], self.cls[1], 0), encodings[0],
                  _special(self.sep[0], self.sep[1], 0)]
        if len(encodings) == 2:
            result += [_special(self.sep[0], self.sep[1], 0), encodings[1],
                       _special(self.sep[0], self.sep[1], 0)]
        return result


class ByteLevelProcessing(PostProcessor):
    """Only trims offsets in HF; ids and type ids are unchanged."""


class Sequence(PostProcessor):
    def __init__(self, processors: list):
        self.processors = processors

    def added_tokens(self, is_pair):
        return sum(processor.added_tokens(is_pair) for processor in self.processors)

    def process_encodings(self, encodings, add_special_tokens):
        for processor in self.processors:
            encodings = processor.process_encodings(encodings, add_special_tokens)
        return encodings


def _token_pair(fields: Fields, key: str) -> tuple:
    value = fields.get(key)
    where = fields.path(key)
    if not isinstance(value, list) or len(value) != 2:
        raise FormatError(f"{SOURCE} {where}: expected [token, id], got {describe(value)}")
    return as_string(value[0], f"{where}[0]"), as_int(value[1], f"{where}[1]")


def _sequence(fields: Fields, depth: int) -> Sequence:
    return Sequence(sequence_steps(fields, "processors", post_processor_from_config, depth))


# type -> builder(fields); Sequence is handled apart (it recurses).
BUILDERS = {
    "TemplateProcessing": lambda fields: TemplateProcessing.from_config(fields.config,
                                                                        fields.where),
    "BertProcessing": lambda fields: BertProcessing(_token_pair(fields, "sep"),
                                                    _token_pair(fields, "cls")),
    "RobertaProcessing": lambda fields: RobertaProcessing(_token_pair(fields, "sep"),
                                                          _token_pair(fields, "cls")),
    "ByteLevel": lambda fields: ByteLevelProcessing(),
}


def post_processor_from_config(config, where: str = "post_processor", depth: int = 0):
    if config is None:
        return None
    check_nesting(depth, where)
    fields = Fields(config, where)
    kind = fields.string("type")
    if kind == "Sequence":
        return _sequence(fields, depth)
    if kind in BUILDERS:
        return BUILDERS[kind](fields)
    raise UnsupportedError(f"{SOURCE} {where}: unknown post-processor type {describe(kind)}")
