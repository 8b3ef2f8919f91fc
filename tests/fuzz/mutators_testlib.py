"""Deterministic mutations of seed inputs: bytes, integer fields, and JSON structure.

Every function takes a ``random.Random`` and returns new bytes; nothing reads the clock or a
global generator, so a (seed, case number) pair always yields the same input (see ``mutate``).

Why these mutations: the parsers read lengths, counts, offsets and dtypes from the input and
must check each against the bytes actually present. Boundary integers written over exactly
those fields (``IntField``) are what finds missing checks; random byte noise alone rarely lands
on a field of a file that is mostly tensor data. JSON inputs (tokenizer.json, config.json, the
safetensors header) are parsed first and mutated as trees, because a flipped byte in JSON
usually just makes it invalid JSON, which exercises one error path only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random

# Values that break arithmetic on counts and sizes: zero, one, signed/unsigned maxima, and
# all-ones (-1 once truncated to the field's width).
BOUNDARY_INTS = (0, 1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**32 - 1, 2**63 - 1,
                 2**64 - 1, -1)
INT_WIDTHS = (1, 2, 4, 8)
# Bytes that are special in many formats: NUL, high bit, all ones, ASCII punctuation of JSON.
INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, ord('"'), ord("\\"), ord("{"), ord("["))
# Caps keep one case's input (and so the parent's memory) small; the parsers must cope with
# the *claims* in a small input, not with huge inputs.
MAX_INSERT = 4096
MAX_LONG_STRING = 200_000
DEEP_NESTING = (100, 1_000, 10_000, 100_000)
# Strings that break a regex compiler or a regex engine: tokenizer.json stores patterns as
# strings ({"Regex": ...}), and the package compiles them with Python's re.
HOSTILE_PATTERNS = ("(a+)+$", "(\\w+\\s?)*$", "[", "(?P<", "\\", "(?i", "\\p{L}+", "\\X",
                    "a{1000000000}", "(?<=a+)b", "(?:){99999}", "\\N{nope}")

# Transplants copy parts of other seeds; these bounds keep the copy (and so the case) cheap.
MAX_TRANSPLANT_ITEMS = 2000
MAX_DONOR_BYTES = 500_000
# How many byte mutations one case stacks: mostly one, so that most cases stay close enough
# to a valid file to get past the first check.
STACKED_MUTATION_WEIGHTS = {1: 50, 2: 25, 3: 15, 4: 10}


@dataclasses.dataclass(frozen=True)
class IntField:
    """An integer field of a seed at ``offset``, ``width`` bytes, little-endian unless ``big``."""

    offset: int
    width: int
    big: bool = False


@dataclasses.dataclass
class Seed:
    """One real-format input a target is fuzzed from.

    ``fields``: integer fields found while building or walking the file (lengths, counts,
    offsets, dtypes, dims). ``header_end``: where the structure ends and bulk data begins;
    random offsets favour the part before it. ``json_span``: (start, end) of a JSON text inside
    the input (the whole file for tokenizer.json), with ``json_length_field`` the field that
    stores its length, if any (safetensors). ``rebuild``: an optional structure-aware
    generator, ``rebuild(rng) -> bytes`` (GGUF metadata re-encoded with changed values).
    ``weight``: how often this seed is picked, relative to the target's other seeds.
    ``kind``: which loader a config.json seed belongs to (bert, t5, llama, ...)."""

    name: str
    data: bytes
    fields: tuple = ()
    header_end: int | None = None
    json_span: tuple | None = None
    json_length_field: IntField | None = None
    rebuild: object = None
    weight: float = 1.0
    kind: str = ""


# -- byte-level mutations -----------------------------------------------------------------------
def _offset(rng: random.Random, seed: Seed, size: int) -> int:
    """A random offset in [0, size), favouring the header where the fields live."""
    if size == 0:
        return 0
    header = min(seed.header_end or size, size)
    if rng.random() < 0.8:
        return rng.randrange(max(header, 1))
    return rng.randrange(size)


def flip_bits(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    for _ in range(rng.randint(1, 8)):
        if data:
            data[_offset(rng, seed, len(data))] ^= 1 << rng.randrange(8)
    return data


def set_bytes(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        if data:
            value = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randrange(256)
            data[_offset(rng, seed, len(data))] = value
    return data


def _chunk(rng: random.Random, data: bytearray) -> bytes:
    """Bytes to insert: random noise, zeros, or a copy of another part of the same input
    (which repeats real records, e.g. a second tensor info)."""
    size = rng.randint(1, MAX_INSERT)
    choice = rng.random()
    if choice < 0.4 and data:
        start = rng.randrange(len(data))
        return bytes(data[start:start + size])
    if choice < 0.6:
        return bytes(size)
    return rng.randbytes(size)


def insert_chunk(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    at = _offset(rng, seed, len(data) + 1)
    data[at:at] = _chunk(rng, data)
    return data


def delete_chunk(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    if data:
        at = _offset(rng, seed, len(data))
        del data[at:at + rng.randint(1, MAX_INSERT)]
    return data


def truncate(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    """Cut the input short: inside the header, inside a field, or inside the data."""
    if not data:
        return data
    if seed.fields and rng.random() < 0.5:
        field = rng.choice(seed.fields)
        cut = field.offset + rng.randrange(field.width + 1)
    else:
        cut = _offset(rng, seed, len(data))
    del data[cut:]
    return data


def boundary_value(rng: random.Random, old: int, width: int) -> int:
    """A boundary integer, or a small lie about the old value (off by one, doubled)."""
    choice = rng.random()
    if choice < 0.7:
        value = rng.choice(BOUNDARY_INTS)
    elif choice < 0.85:
        value = old + rng.choice((-1, 1))
    else:
        value = old * rng.choice((2, 16, 1024)) + rng.randrange(2)
    return value & ((1 << (8 * width)) - 1)  # -1 becomes all ones; big values wrap


def overwrite_int(rng: random.Random, data: bytearray, seed: Seed) -> bytearray:
    """Write a boundary value over a known integer field (or an aligned spot in the header)."""
    if seed.fields and rng.random() < 0.85:
        field = rng.choice(seed.fields)
        offset, width, big = field.offset, field.width, field.big
    else:
        width = rng.choice(INT_WIDTHS)
        offset = _offset(rng, seed, len(data)) // width * width
        big = False
    if offset + width > len(data):
        return data
    order = "big" if big else "little"
    old = int.from_bytes(data[offset:offset + width], order)
    new = boundary_value(rng, old, width)
    data[offset:offset + width] = new.to_bytes(width, order)
    return data


def splice(rng: random.Random, data: bytearray, seed: Seed, others: list) -> bytearray:
    """The head of this input followed by the tail of another seed of the same target."""
    if not others or not data:
        return data
    other = rng.choice(others).data
    if not other:
        return data
    return bytearray(data[:_offset(rng, seed, len(data))]) + other[rng.randrange(len(other)):]


BYTE_MUTATIONS = (flip_bits, set_bytes, insert_chunk, delete_chunk, truncate, overwrite_int)
# Integer fields are the most productive: pick them more often than plain noise.
BYTE_WEIGHTS = (1, 1, 1, 1, 1, 3)


# -- JSON mutations ----------------------------------------------------------------------------
class _Raw:
    """A JSON text that ``json.dumps`` cannot produce (duplicate keys, 100 000-deep nesting,
    a 400-digit number): stored as a placeholder string and substituted after dumping."""

    counter = 0

    def __init__(self, text: str, replaces_object: bool = False):
        _Raw.counter += 1
        self.marker = f"\u0001fuzz-raw-{_Raw.counter}\u0001"
        self.text = text
        # True: the marker sits in a one-key object {"\u0001": marker}, replaced as a whole.
        self.replaces_object = replaces_object


def _pick_path(rng: random.Random, root) -> list:
    """A random path of keys/indices from the root, descending with probability 0.7 per level
    (0.95 at the root).

    Descending at random (instead of sampling all nodes) keeps the cost at the tree's depth
    and spreads mutations over the top-level structure (normalizer, pre_tokenizer, model type
    ...) rather than over the 50 000 vocabulary entries."""
    path = []
    node = root
    # Replacing the whole document is tried, but rarely: it tests one check only.
    while isinstance(node, (dict, list)) and node and rng.random() < (0.95 if not path else 0.7):
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
    return path


def _get(root, path):
    for key in path:
        root = root[key]
    return root


def _replacement(rng: random.Random, old, raws: list):
    """A value of another type, an extreme value, or a raw text JSON cannot express."""
    choice = rng.randrange(13)
    if choice == 11:
        return rng.choice(HOSTILE_PATTERNS)
    if choice == 0:
        return rng.choice((None, True, False))
    if choice == 1:
        return rng.choice(BOUNDARY_INTS + (-2**63, 2**64, 10**30, -10**30))
    if choice == 2:
        return rng.choice((0.5, -0.0, 1e308, -1e308, 1e-320))
    if choice == 3:
        return rng.choice(("", " ", "\u0000", "\ud800", "é\u0301", "\U0001F600", "a" * 1000))
    if choice == 4:
        return "x" * rng.randint(1, MAX_LONG_STRING)
    if choice == 5:
        return rng.choice(([], {}, [None], [[]], {"": None}))
    if choice == 6:
        depth = rng.choice(DEEP_NESTING)
        opening, closing = rng.choice((("[", "]"), ('{"a":', "}")))
        raw = _Raw(opening * depth + "1" + closing * depth)
        raws.append(raw)
        return raw.marker
    if choice == 7:
        raw = _Raw(rng.choice(("1" + "0" * 400, "-" + "9" * 400, "1e400", "-1e400", "NaN",
                               "Infinity", "-Infinity", "1.5e-400")))
        raws.append(raw)
        return raw.marker
    if choice == 8 and isinstance(old, str):
        return old * rng.choice((2, 100))
    if choice == 9 and isinstance(old, (int, float)) and not isinstance(old, bool):
        return -old if rng.random() < 0.5 else old + rng.choice((-1, 1))
    if choice == 10 and isinstance(old, (list, dict)) and old:
        return list(old.values()) if isinstance(old, dict) else {str(i): v for i, v in
                                                                  enumerate(old)}
    return str(old)[:100]


def _mutate_container(rng: random.Random, node, raws: list) -> None:
    """Drop, duplicate or rename a key; drop, duplicate, reorder or multiply list items."""
    if isinstance(node, dict) and node:
        key = rng.choice(list(node))
        choice = rng.randrange(4)
        if choice == 0:
            del node[key]
        elif choice == 1:
            node[key + rng.choice(("_", "X", "")) + "2"] = node[key]
        elif choice == 2:
            # A duplicate key needs raw text: json.dumps writes each key once.
            items = [f"{json.dumps(k)}:{json.dumps(v, default=str)}" for k, v in node.items()]
            duplicate = _replacement(rng, node[key], raws)  # a raw text in it is substituted too
            items.append(f"{json.dumps(key)}:{json.dumps(duplicate)}")
            raw = _Raw("{" + ",".join(items) + "}", replaces_object=True)
            raws.append(raw)
            node.clear()
            node["\u0001"] = raw.marker
        else:
            node[rng.choice(("type", "", "\u0000", key.upper()))] = node.pop(key)
    elif isinstance(node, list) and node:
        index = rng.randrange(len(node))
        choice = rng.randrange(4)
        if choice == 0:
            del node[index]
        elif choice == 1:
            node.insert(index, node[index])
        elif choice == 2:
            rng.shuffle(node)
        else:
            node.extend(node[:rng.randint(1, min(len(node), 64))] * rng.choice((2, 10)))


def _transplant(rng: random.Random, root, donors: list):
    """A copy of a random part of this document or of another seed's: a decoder where a
    pre-tokenizer belongs, a Unigram model in a BPE file, real-looking but wrong structure."""
    donor = rng.choice([root] + list(donors))
    part = _get(donor, _pick_path(rng, donor))
    if isinstance(part, (dict, list)) and len(part) > MAX_TRANSPLANT_ITEMS:
        return None
    return json.loads(json.dumps(part))  # a copy: the donor is shared by later cases


def mutate_json_value(rng: random.Random, root, raws: list, donors: list = ()):
    """One structural mutation of a parsed JSON tree (in place where possible); the new root.
    ``donors``: other parsed documents of the same format to transplant parts from."""
    path = _pick_path(rng, root)
    target = _get(root, path)
    if isinstance(target, (dict, list)) and target and rng.random() < 0.4:
        _mutate_container(rng, target, raws)
        return root
    new = _transplant(rng, root, donors) if rng.random() < 0.25 else None
    if new is None:
        new = _replacement(rng, target, raws)
    if not path:
        return new
    _get(root, path[:-1])[path[-1]] = new
    return root


def dump_json(root, raws: list) -> bytes:
    text = json.dumps(root, ensure_ascii=False, default=str)
    # Later raw texts may contain the markers of earlier ones: substitute them first.
    for raw in reversed(raws):
        if raw.replaces_object:
            text = text.replace("{" + json.dumps("\u0001", ensure_ascii=False) + ": "
                                + json.dumps(raw.marker, ensure_ascii=False) + "}", raw.text)
        text = text.replace(json.dumps(raw.marker, ensure_ascii=False), raw.text)
    return text.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=64)
def parsed_json(text: bytes):
    """A seed's parsed JSON, kept (read only!) so that donors are not re-parsed every case;
    None when the text is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def mutate_json_text(rng: random.Random, text: bytes, donors: list = ()) -> bytes | None:
    """1-3 structural mutations of a JSON text; None when it is not JSON."""
    try:
        root = json.loads(text)
    except ValueError:
        return None
    raws: list = []
    for _ in range(rng.randint(1, 3)):
        root = mutate_json_value(rng, root, raws, donors)
    return dump_json(root, raws)


def _donors(seed: Seed, seeds: list) -> list:
    """The parsed JSON of the target's other small JSON seeds (big ones cost too much)."""
    donors = []
    for other in seeds:
        if other is seed or other.json_span is None:
            continue
        start, end = other.json_span
        if end - start <= MAX_DONOR_BYTES:
            tree = parsed_json(other.data[start:end])
            if tree is not None:
                donors.append(tree)
    return donors


def _mutate_json_region(rng: random.Random, seed: Seed, seeds: list) -> bytearray | None:
    start, end = seed.json_span
    mutated = mutate_json_text(rng, seed.data[start:end], _donors(seed, seeds))
    if mutated is None:
        return None
    data = bytearray(seed.data[:start]) + mutated + seed.data[end:]
    field = seed.json_length_field
    # Usually keep the stored length honest, so the parser gets past it to the JSON itself.
    if field is not None and rng.random() < 0.8:
        data[field.offset:field.offset + field.width] = len(mutated).to_bytes(field.width,
                                                                              "little")
    return data


# -- one case ----------------------------------------------------------------------------------
def mutate(rng: random.Random, seeds: list) -> tuple[str, bytes]:
    """(name of the seed used, mutated input) for one case.

    Structure-aware mutations (JSON tree, GGUF metadata rebuild) come first when the seed
    supports them; byte mutations are then stacked on top, 1 to 4 of them (none, more often
    than not, after a structural one, so well-formed but lying inputs are tried too)."""
    seed = rng.choices(seeds, weights=[s.weight for s in seeds])[0]
    data = None
    structural = False
    if seed.rebuild is not None and rng.random() < 0.6:
        data = seed.rebuild(rng)
        structural = data is not None
    if data is None and seed.json_span is not None and rng.random() < 0.9:
        data = _mutate_json_region(rng, seed, seeds)
        structural = data is not None
    data = bytearray(seed.data if data is None else data)
    # Bytes flipped in a JSON text mostly make it invalid UTF-8 or JSON: one error path only.
    if structural and rng.random() < (0.85 if seed.json_span else 0.7):
        return seed.name, bytes(data)
    others = [s for s in seeds if s is not seed]
    count = rng.choices(list(STACKED_MUTATION_WEIGHTS), list(STACKED_MUTATION_WEIGHTS.values()))[0]
    for _ in range(count):
        if others and rng.random() < 0.05:
            data = splice(rng, data, seed, others)
            continue
        mutation = rng.choices(BYTE_MUTATIONS, weights=BYTE_WEIGHTS)[0]
        data = mutation(rng, data, seed)
    return seed.name, bytes(data)


def case_rng(run_seed: int, target: str, case: int) -> random.Random:
    """The generator of one case: each case is reproducible on its own."""
    return random.Random(f"{run_seed}:{target}:{case}")



# -- issue 28: texts, patterns and vocabularies built to cost -----------------------------------
# Patterns whose backtracking is a power of the text length (adjacent repeats over shared
# characters): refused at load since issue 28, so they must stay refused.
POLYNOMIAL_PATTERNS = (".*.*.*.*.*=", "\\s*\\s*\\s*\\s*\\s*\\s*\\s*x", "a*a*b", ".*=.*=",
                       "(a*)(a*)b", "\\s*,?\\s*x", "[ab]*[bc]+d", "(?:a*|b)a*c")
HOSTILE_PATTERNS = HOSTILE_PATTERNS + POLYNOMIAL_PATTERNS
# Characters a text mutation splices in: invalid UTF-8 (lone surrogates once decoded with
# surrogateescape, as Python decodes argv), encoded lone surrogates, whitespace, marks.
HOSTILE_TEXT_PIECES = (b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xed\xb3\xbf",
                       b"\x80", b"\xe2\x96\x81", " \t\r\n".encode(), "\u00a0\u3000".encode(),
                       "e\u0301".encode(), "\U0001F600".encode(), b"\x00")
MAX_HOSTILE_RUN = 12_000


def hostile_text(rng: random.Random, base: bytes = b"") -> bytes:
    """A text for encode(): `base` with hostile pieces spliced in, or long runs of one
    character (a word WordPiece or BPE must split, whitespace a regex must skip)."""
    choice = rng.random()
    if choice < 0.4:
        run = rng.choice((b"a", b" ", b"=", b"ab", b"\xc3\xa9", b"\n", b"1"))
        return run * rng.randint(1, MAX_HOSTILE_RUN // len(run))
    data = bytearray(base or b"Hello world")
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.choice(HOSTILE_TEXT_PIECES) * rng.choice((1, 1, 2, 50))
    return bytes(data)


def blow_up_vocabulary(rng: random.Random) -> dict:
    """GGUF tokenizer metadata (as JSON values) whose derived tables blow up when built
    naively: every piece a prefix of the next ('a' ... 'a' * N: N^2 / 2 SentencePiece
    merges), pieces of many distinct lengths, or pieces made of two halves of each other."""
    count = rng.choice((10, 100, 1000, 1800, 3000))
    shape = rng.random()
    if shape < 0.5:
        letter = rng.choice("ab\u2581")
        pieces = [letter * length for length in range(1, count + 1)]
    elif shape < 0.8:
        pieces = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 64)))
                  for _ in range(count)]
    else:
        half = ["a" * length for length in range(1, int(count ** 0.5) + 2)]
        pieces = sorted({left + "b" + right for left in half for right in half})[:count]
    tokens = ["<unk>", "<s>", "</s>"] + pieces
    model = rng.choice(("llama", "llama", "gpt2", "bert"))
    metadata = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.scores": [0.0, 0.0, 0.0] + [-float(len(p)) for p in pieces],
                "tokenizer.ggml.token_type": [2, 3, 3] + [1] * len(pieces),
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    if model == "gpt2":
        metadata["tokenizer.ggml.merges"] = [f"{p[:1]} {p[1:]}" for p in pieces if len(p) > 1]
    return metadata
