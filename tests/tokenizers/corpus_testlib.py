"""A varied, seeded text corpus for comparing tokenizers against HF `tokenizers`.

Hand-written samples cover the tricky classes (prose, code, numbers, punctuation and whitespace
runs, composed/decomposed accents, CJK, emoji with ZWJ sequences, RTL scripts, control
characters); a seeded generator adds random mixtures and random Unicode strings. Everything is
deterministic for a given seed, so a failure can be reproduced by its index.
"""

from __future__ import annotations

import random
import unicodedata

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "I can't believe it's already 5 o'clock -- we'll be late, won't we?",
    "Dr. Smith's lab (room 4B) reported a 12.5% increase in yield, i.e. better results.",
    "She said: \"Don't go there!\" and he replied 'OK, I won't'.",
    "HELLO World, MiXeD CaSe and ALLCAPS words; they're weird.",
    "Call me Ishmael. Some years ago - never mind how long precisely - having little money.",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were "
    "perfectly normal, thank you very much.",
]
CODE = [
    "def f(x):\n    return x ** 2 + 3*x - 1  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "if __name__ == '__main__':\n\tmain(sys.argv[1:])",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%ann%';",
    "const x = {a: 1, 'b': [2, 3], \"c\": null}; // => x.a === 1",
    "<div class=\"row\"><span id='x'>&amp; &lt;tag&gt;</span></div>",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", v); Ok(()) }",
    "$ ls -la | grep '^d' > out.txt 2>&1 && echo $?",
]
NUMBERS = [
    "1234567890", "3.14159 2.71828 1e-10 -42 +7", "1,000,000.00 and 12,34 EUR",
    "Call 555-0123 or +1 (800) 555-0199 ext. 42", "0x1F 0b1010 0o777 1_000_000",
    "٣٤٥ ١٢ ۴۵۶ ४५६ ๑๒๓ ①②③ ½ ¾ ⅔ Ⅻ", "2024-01-31T23:59:59Z", "v1.2.3-rc.4+build.5",
]
PUNCTUATION = [
    "!!!???...", "--- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "?!?!?! ;;; ::: ,,, ''' \"\"\" ``` ~~~ ||| \\\\\\ /// <<< >>>",
    "¡Hola! ¿Qué tal? «quotes» „German“ “curly” ‘single’ — – … ‰ † ‡ • ′ ″",
    "。、！？「」『』（）【】《》〈〉：；", "a.b,c;d:e!f?g", "....word....", "'s 't 're 've 'm 'll 'd",
]
WHITESPACE = [
    "two  spaces", "three   spaces and\ttabs\t\there", "lines\nand\n\nblank\n\n\nlines",
    "  leading and trailing  ", "\t\ttabs first", "crlf\r\nline\r\n", "mixed \t \n \r\n end",
    "nbsp\u00a0here thin\u2009space ideographic\u3000space em\u2003space",
    "line\u2028sep para\u2029sep", "  ", "\n", " \t\n ", "trailing spaces   ", "x\u000b\u000cy",
]
ACCENTS = [
    "café naïve résumé façade coöperate", "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "Ångström Øre æther œuvre straße Łódź İstanbul", "ÀÉÎÕÜ àéîõü ÇçÑñ",
    "e\u0301\u0300\u0302 o\u0308\u0304 a\u030a", "Σίσυφος ΟΔΟΣ ὀδυσσεύς",
    "Tiếng Việt có dấu: Hà Nội, Sài Gòn", "ﬁ ﬂ ﬀ ﬃ ™ ℌ ① ㍿ ｆｕｌｌｗｉｄｔｈ",
]
CJK = [
    "日本語のテキストです。", "中文文本处理测试，包括标点。", "한국어 텍스트 처리", "漢字かなカナ混じり文",
    "𠀀𠀁𪚥 rare CJK ext", "中English混合text文", "ｶﾀｶﾅ ハンカク",
]
EMOJI = [
    "I love it 😀😃😄", "👍🏽 👋🏿 skin tones", "family 👨‍👩‍👧‍👦 and 👩‍❤️‍👨 ZWJ",
    "flags 🇫🇷🇯🇵🇺🇸 tags 🏴󠁧󠁢󠁳󠁣󠁴󠁿", "keycaps 1️⃣ #️⃣ *️⃣", "❤️ ☺️ ✌🏻 🥰 🫠 🧑‍💻",
]
RTL = [
    "مرحبا بالعالم", "שלום עולם", "English then عربي then English",
    "العربية ١٢٣ and 123", "עברית עם ניקוד: בְּרֵאשִׁית", "فارسی: سلام دنیا",
]
CONTROL = [
    "null\x00byte", "bell\x07 escape\x1b[31mred\x1b[0m", "del\x7f and \x80\x9f C1",
    "zero\u200bwidth\u200cjoiner\u200dnon", "bom\ufeffinside", "soft\u00adhyphen",
    "replacement \ufffd char", "\x01\x02\x03", "bidi \u202eoverride\u202c \u2066iso\u2069",
    "unit\x1fsep\x1erecord",
]
SAMPLES = PROSE + CODE + NUMBERS + PUNCTUATION + WHITESPACE + ACCENTS + CJK + EMOJI + RTL + CONTROL

# Code point ranges the random generator draws from, weighted toward real text.
RANDOM_RANGES = [
    (0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x21FF), (0x2460, 0x24FF),
    (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF),
    (0x10000, 0x1FFFF), (0x20000, 0x2A6DF), (0xE0000, 0xE01EF),
]


def random_unicode_string(rng: random.Random, length: int) -> str:
    """Random assigned, non-surrogate code points (unassigned ones are skipped: their
    properties differ between Unicode versions of Python and of the Rust crates)."""
    chars = []
    while len(chars) < length:
        first, last = rng.choice(RANDOM_RANGES)
        char = chr(rng.randint(first, last))
        if unicodedata.category(char) in ("Cn", "Cs"):
            continue
        chars.append(char)
    return "".join(chars)


def random_mixture(rng: random.Random, special_tokens: list) -> str:
    """A few samples glued with random separators, sometimes with special tokens inside."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.6:
            parts.append(rng.choice(SAMPLES))
        elif roll < 0.8:
            parts.append(random_unicode_string(rng, rng.randint(1, 12)))
        elif special_tokens:
            parts.append(rng.choice(special_tokens))
        else:
            parts.append(rng.choice(WHITESPACE))
    separators = ["", " ", "  ", "\n", "\t", " \n "]
    text = parts[0]
    for part in parts[1:]:
        text += rng.choice(separators) + part
    return text


def build_corpus(seed: int = 0, random_count: int = 1500, special_tokens=()) -> list:
    """All hand-written samples, their case/spacing variants, then seeded random strings."""
    rng = random.Random(seed)
    special_tokens = list(special_tokens)
    corpus = list(SAMPLES)
    corpus += [sample.upper() for sample in PROSE + ACCENTS]
    corpus += [" " + sample for sample in PROSE[:4] + CJK[:2]]
    corpus += [unicodedata.normalize("NFD", sample) for sample in ACCENTS]
    corpus.append("")
    for token in special_tokens:
        corpus += [token, f"a{token}b", f" {token} ", f"{token}{token}", f"x {token}y",
                   f"{token}\n text"]
    for _ in range(random_count):
        kind = rng.random()
        if kind < 0.5:
            corpus.append(random_mixture(rng, special_tokens))
        else:
            corpus.append(random_unicode_string(rng, rng.randint(1, 40)))
    return corpus
