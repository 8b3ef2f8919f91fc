"""Post-processors of the HF tokenizer.json format: add special tokens and set type ids."""

from __future__ import annotations

from ..errors import FormatError, UnsupportedError
from .encoding import Encoding


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
    def __init__(self, single: list, pair: list, special_tokens: dict):
        self.single = single
        self.pair = pair
        self.special_tokens = special_tokens  # name -> (ids, tokens)
        for template in (single, pair):
            for kind, name, _ in template:
                if kind == "special" and name not in special_tokens:
                    raise FormatError(f"tokenizer.json post_processor: template uses special "
                                      f"token {name!r} missing from special_tokens")

    def added_tokens(self, is_pair):
        template = self.pair if is_pair else self.single
        return sum(len(self.special_tokens[name][0]) for kind, name, _ in template
                   if kind == "special")

    def process_encodings(self, encodings, add_special_tokens):
        template = self.pair if len(encodings) == 2 else self.single
        result = []
        for kind, name, type_id in template:
            if kind == "sequence":
                encoding = encodings[0 if name == "A" else 1]
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
        def parse_template(pieces, name):
            if isinstance(pieces, str):
                return [parse_piece_string(piece) for piece in pieces.split()]
            parsed = []
            for piece in pieces or []:
                if "Sequence" in piece:
                    parsed.append(("sequence", piece["Sequence"]["id"],
                                   piece["Sequence"].get("type_id", 0)))
                elif "SpecialToken" in piece:
                    parsed.append(("special", piece["SpecialToken"]["id"],
                                   piece["SpecialToken"].get("type_id", 0)))
                else:
                    raise FormatError(f"tokenizer.json {where}.{name}: unknown piece {piece!r}")
            return parsed

        special_tokens = {}
        for name, entry in (config.get("special_tokens") or {}).items():
            if "ids" not in entry or "tokens" not in entry:
                raise FormatError(f"tokenizer.json {where}.special_tokens[{name!r}]: needs "
                                  f"'ids' and 'tokens'")
            special_tokens[name] = (list(entry["ids"]), list(entry["tokens"]))
        single = parse_template(config.get("single"), "single")
        pair = parse_template(config.get("pair"), "pair")
        return cls(single, pair, special_tokens)


def parse_piece_string(piece: str):
    """Template strings like "$A", "$B:1", "[CLS]", "[SEP]:1"."""
    name, _, type_text = piece.partition(":")
    type_id = int(type_text) if type_text else 0
    if name.startswith("$"):
        sequence = name[1:] or "A"
        if sequence.isdigit():
            # "$0" / "$1" are the type-id shorthand for sequence A.
            return ("sequence", "A", int(sequence))
        return ("sequence", sequence, type_id)
    return ("special", name, type_id)


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


def _token_pair(config: dict, key: str, where: str) -> tuple:
    value = config.get(key)
    if not isinstance(value, list) or len(value) != 2:
        raise FormatError(f"tokenizer.json {where}.{key}: expected [token, id], got {value!r}")
    return value[0], value[1]


def post_processor_from_config(config, where: str = "post_processor"):
    if config is None:
        return None
    if not isinstance(config, dict):
        raise FormatError(f"tokenizer.json {where}: expected an object, got {config!r}")
    kind = config.get("type")
    if kind == "TemplateProcessing":
        return TemplateProcessing.from_config(config, where)
    if kind == "BertProcessing":
        return BertProcessing(_token_pair(config, "sep", where), _token_pair(config, "cls", where))
    if kind == "RobertaProcessing":
        return RobertaProcessing(_token_pair(config, "sep", where),
                                 _token_pair(config, "cls", where))
    if kind == "ByteLevel":
        return ByteLevelProcessing()
    if kind == "Sequence":
        children = config.get("processors")
        if children is None:
            raise FormatError(f"tokenizer.json {where}: missing field 'processors'")
        return Sequence([post_processor_from_config(child, f"{where}.processors[{index}]")
                         for index, child in enumerate(children)])
    if kind is None:
        raise FormatError(f"tokenizer.json {where}: missing field 'type'")
    raise UnsupportedError(f"tokenizer.json {where}: unknown post-processor type {kind!r}")
