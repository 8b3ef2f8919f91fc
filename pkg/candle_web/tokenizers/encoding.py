"""The `Encoding` result and the truncation / padding steps applied to it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import CandleError, FormatError
from .fields import MAX_COUNT, MAX_PADDED_LENGTH, Fields, as_int, describe


@dataclass
class Encoding:
    """Token ids of one input (or pair), with the per-token side lists HF also returns."""

    ids: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    type_ids: list = field(default_factory=list)
    attention_mask: list = field(default_factory=list)
    special_tokens_mask: list = field(default_factory=list)

    @classmethod
    def from_tokens(cls, tokens: list, type_id: int = 0, special: bool = False) -> "Encoding":
        """From [(id, token string)]."""
        return cls(ids=[token_id for token_id, _ in tokens],
                   tokens=[token for _, token in tokens],
                   type_ids=[type_id] * len(tokens), attention_mask=[1] * len(tokens),
                   special_tokens_mask=[1 if special else 0] * len(tokens))

    def __len__(self) -> int:
        return len(self.ids)

    # HF's Python binding names this `type_ids`; the brief of this project wrote type_type_ids.
    @property
    def type_type_ids(self) -> list:
        return self.type_ids

    def set_type_ids(self, type_id: int) -> None:
        self.type_ids = [type_id] * len(self.ids)

    def extend(self, other: "Encoding") -> None:
        self.ids += other.ids
        self.tokens += other.tokens
        self.type_ids += other.type_ids
        self.attention_mask += other.attention_mask
        self.special_tokens_mask += other.special_tokens_mask

    def truncate(self, max_length: int, direction: str = "Right") -> None:
        if len(self.ids) <= max_length:
            return
        if direction == "Right":
            keep = slice(0, max_length)
        else:
            keep = slice(len(self.ids) - max_length, len(self.ids))
        self.ids = self.ids[keep]
        self.tokens = self.tokens[keep]
        self.type_ids = self.type_ids[keep]
        self.attention_mask = self.attention_mask[keep]
        self.special_tokens_mask = self.special_tokens_mask[keep]

    def pad(self, target_length: int, pad_id: int, pad_type_id: int, pad_token: str,
            direction: str = "Right") -> None:
        missing = target_length - len(self.ids)
        if missing <= 0:
            return
        if direction == "Right":
            self.ids = self.ids + [pad_id] * missing
            self.tokens = self.tokens + [pad_token] * missing
            self.type_ids = self.type_ids + [pad_type_id] * missing
            self.attention_mask = self.attention_mask + [0] * missing
            self.special_tokens_mask = self.special_tokens_mask + [1] * missing
        else:
            self.ids = [pad_id] * missing + self.ids
            self.tokens = [pad_token] * missing + self.tokens
            self.type_ids = [pad_type_id] * missing + self.type_ids
            self.attention_mask = [0] * missing + self.attention_mask
            self.special_tokens_mask = [1] * missing + self.special_tokens_mask


TRUNCATION_STRATEGIES = ("LongestFirst", "OnlyFirst", "OnlySecond")
DIRECTIONS = ("Right", "Left")


@dataclass
class TruncationParams:
    max_length: int = 512
    strategy: str = "LongestFirst"  # LongestFirst | OnlyFirst | OnlySecond
    stride: int = 0
    direction: str = "Right"  # Right | Left

    @classmethod
    def from_config(cls, config: dict, where: str = "truncation") -> "TruncationParams":
        fields = Fields(config, where)
        return cls(max_length=fields.integer("max_length", 512, maximum=MAX_COUNT),
                   strategy=fields.choice("strategy", TRUNCATION_STRATEGIES, "LongestFirst"),
                   stride=fields.integer("stride", 0, maximum=MAX_COUNT),
                   direction=fields.choice("direction", DIRECTIONS, "Right"))


@dataclass
class PaddingParams:
    strategy: object = "BatchLongest"  # "BatchLongest" or a fixed int length
    direction: str = "Right"
    pad_to_multiple_of: object = None
    pad_id: int = 0
    pad_type_id: int = 0
    pad_token: str = "[PAD]"

    @classmethod
    def from_config(cls, config: dict, where: str = "padding") -> "PaddingParams":
        """Lengths are bounded by MAX_PADDED_LENGTH here, at load: each padded encoding
        allocates that many entries."""
        fields = Fields(config, where)
        strategy = fields.get("strategy", "BatchLongest")
        if strategy != "BatchLongest":
            strategy = _fixed_length(strategy, fields.path("strategy"))
        return cls(strategy, fields.choice("direction", DIRECTIONS, "Right"),
                   fields.integer("pad_to_multiple_of", None, maximum=MAX_PADDED_LENGTH),
                   fields.integer("pad_id", 0), fields.integer("pad_type_id", 0),
                   fields.string("pad_token", "[PAD]"))


def _fixed_length(strategy, where: str) -> int:
    """{"Fixed": n}, the only strategy besides "BatchLongest"."""
    if not isinstance(strategy, dict) or list(strategy) != ["Fixed"]:
        raise FormatError(f"tokenizer.json {where}: unknown value {describe(strategy)} "
                          f"(expected \"BatchLongest\" or {{\"Fixed\": length}})")
    return as_int(strategy["Fixed"], f"{where}.Fixed", maximum=MAX_PADDED_LENGTH)


def truncate_encodings(first: Encoding, second, params: TruncationParams, max_length: int):
    """HF's truncate_encodings (without overflow bookkeeping); `max_length` already has the
    post-processor's special tokens subtracted."""
    if max_length == 0:
        first.truncate(0, params.direction)
        if second is not None:
            second.truncate(0, params.direction)
        return
    total = len(first) + (len(second) if second is not None else 0)
    if total <= max_length:
        return
    to_remove = total - max_length
    if params.strategy == "LongestFirst":
        if second is None:
            first.truncate(total - to_remove, params.direction)
            return
        short, long_ = len(first), len(second)
        swapped = short > long_
        if swapped:
            short, long_ = long_, short
        if short > max_length:
            long_ = short
        else:
            long_ = max(short, max_length - short)
        if short + long_ > max_length:
            short = max_length // 2
            long_ = short + max_length % 2
        if swapped:
            short, long_ = long_, short
        first.truncate(short, params.direction)
        second.truncate(long_, params.direction)
        return
    target = first if params.strategy == "OnlyFirst" else second
    if target is None:
        raise CandleError("truncation strategy OnlySecond needs a pair of sequences")
    if len(target) <= to_remove:
        raise CandleError(f"truncation: the sequence to truncate ({len(target)} tokens) is "
                          f"shorter than the {to_remove} tokens to remove")
    target.truncate(len(target) - to_remove, params.direction)


def pad_encodings(encodings: list, params: PaddingParams) -> None:
    if not encodings:
        return
    if params.strategy == "BatchLongest":
        target = max(len(encoding) for encoding in encodings)
    else:
        target = params.strategy
    multiple = params.pad_to_multiple_of
    if multiple and target % multiple:
        target += multiple - target % multiple
    for encoding in encodings:
        encoding.pad(target, params.pad_id, params.pad_type_id, params.pad_token,
                     params.direction)
