"""The command-line options of the transcribe pipeline, in one place below the CLI: `candle-web
transcribe`, `batch transcribe` (which shares the same argparse actions) and the API (which
decodes a request with the same defaults) all take them from here, so an option and its default
cannot differ between them. Each is range-checked as it is parsed (generation/option_limits.py),
a bad value being a usage error naming the option before any model loads.

Standard library, the package's option limits and its settings table only: the CLI builds its
parser from these.
"""

from __future__ import annotations

import argparse

from ..backend.settings import COMPUTE_TYPES, override_settings
from ..core.errors import CandleError, check_text
from ..generation import option_limits as limits


def add_transcribe_options(t) -> None:
    """The decoding options of `transcribe` (everything but the files, model and output)."""
    t.add_argument("--language", default=None, type=text_argument("--language"), help="language code for multilingual models (default: detect)")
    t.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    t.add_argument("--beam-size", type=limits.BEAM_SIZE.argparse_type(), default=None,
                   help=f"beam search width, 1..{limits.MAX_BEAM_SIZE} (default: greedy); each beam "
                        "keeps its own decoder state (~26 MB on whisper-tiny.en, ~51 MB on "
                        "whisper-base), and a width that does not fit in half the memory is refused")
    t.add_argument("--initial-prompt", default=None, type=text_argument("--initial-prompt"))
    t.add_argument("--without-timestamps", action="store_true")
    t.add_argument("--no-fallback", action="store_true", help="decode at --temperature only")
    _long_form_arguments(t)
    _word_arguments(t)
    _vad_arguments(t)


def add_compute_type_argument(parser) -> None:
    """--compute-type (faster-whisper's option name) for `transcribe`, `generate`, `chat` and
    `serve`: the arithmetic of the models the command loads (settings' compute_type)."""
    parser.add_argument("--compute-type", choices=COMPUTE_TYPES, default=None,
                        help="int8: the fused numba parts multiply int8 weights by int8 "
                             "activations (integer dot products); float32: f32 arithmetic, the "
                             "reference (default: $CANDLE_WEB_COMPUTE_TYPE, else float32)")


def apply_compute_type(args) -> None:
    """Sets --compute-type for this process, before any model loads (the parts read it when
    they are built); without the flag the environment's choice stands."""
    if getattr(args, "compute_type", None) is not None:
        override_settings(compute_type=args.compute_type)


def transcribe_defaults() -> argparse.Namespace:
    """What `candle-web transcribe FILE` decodes with when given no option."""
    parser = argparse.ArgumentParser(add_help=False)
    add_transcribe_options(parser)
    return parser.parse_args([])


def text_argument(name: str):
    """argparse `type=` for a text argument: Python decodes argv bytes that are not UTF-8 to
    lone surrogates (surrogateescape), which the tokenizers refuse; refused here instead, as a
    usage error naming the argument (exit status 2), before any model loads. File paths are not
    checked: a file name that is not UTF-8 is still a file."""
    def check(value: str) -> str:
        try:
            return check_text(value, name)
        except CandleError as error:  # argparse names the argument itself
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{name}: ")) from None

    return check


def _bool_argument(text: str) -> bool:
    choices = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return choices[text.lower()]


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _long_form_arguments(t) -> None:
    """openai-whisper's options for long audio, with its defaults (`none` turns a check off)."""
    t.add_argument("--temperature", type=limits.TEMPERATURE.argparse_type(), default=0.0,
                   help="temperature of the first decode of a window (default 0: greedy)")
    t.add_argument("--temperature-increment-on-fallback", type=_optional(limits.Limit(False, 0.0, 1.0).argparse_type()),
                   default=0.2, help="retry a window at temperatures up by this to 1.0 when it "
                                     "fails the checks below (default 0.2; none: no retry)")
    t.add_argument("--condition-on-previous-text", type=_bool_argument, default=True,
                   metavar="{True,False}",
                   help="prompt each window with the text before it (default True)")
    t.add_argument("--compression-ratio-threshold", type=_optional(limits.THRESHOLD.argparse_type()),
                   default=2.4, help="a window whose text gzips better than this is retried "
                                     "(too repetitive; default 2.4)")
    t.add_argument("--logprob-threshold", type=_optional(limits.THRESHOLD.argparse_type()), default=-1.0,
                   help="a window whose mean token log-probability is below this is retried "
                        "(default -1.0)")
    t.add_argument("--no-speech-threshold", type=_optional(limits.THRESHOLD.argparse_type()), default=0.6,
                   help="a window whose <|nospeech|> probability is above this, and whose "
                        "log-probability is below --logprob-threshold, is silence (default 0.6)")


def _word_arguments(t) -> None:
    t.add_argument("--word-timestamps", action="store_true",
                   help="per-word start, end and probability (JSON; SRT/VTT cues from words)")
    t.add_argument("--prepend-punctuations", default="\"'“¿([{-", type=text_argument("--prepend-punctuations"),
                   help="with --word-timestamps: these join the word after them")
    t.add_argument("--append-punctuations", default="\"'.。,，!！?？:：”)]}、",
                   type=text_argument("--append-punctuations"),
                   help="with --word-timestamps: these join the word before them")
    t.add_argument("--highlight-words", action="store_true",
                   help="with --word-timestamps: SRT/VTT underline each word as it is spoken")
    t.add_argument("--max-line-width", type=limits.Limit(True, 1, 10_000).argparse_type(), default=None,
                   help="with --word-timestamps: characters per subtitle line")
    t.add_argument("--max-line-count", type=limits.Limit(True, 1, 1000).argparse_type(), default=None,
                   help="with --word-timestamps: lines per subtitle cue")


def _vad_arguments(t) -> None:
    """Silero VAD before Whisper, with faster-whisper's VadOptions names and defaults."""
    t.add_argument("--vad", action="store_true",
                   help="transcribe only the speech Silero VAD finds (times stay on the recording's)")
    t.add_argument("--vad-threshold", type=limits.Limit(False, 0.0, 1.0).argparse_type(), default=0.5,
                   help="with --vad: speech probability from which a chunk is speech (default 0.5)")
    t.add_argument("--vad-min-speech-duration-ms", type=limits.Limit(True, 0, 3_600_000).argparse_type(),
                   default=0, help="with --vad: drop speech shorter than this (default 0)")
    t.add_argument("--vad-min-silence-duration-ms", type=limits.Limit(True, 0, 3_600_000).argparse_type(),
                   default=2000, help="with --vad: silence that ends speech (default 2000)")
    t.add_argument("--vad-speech-pad-ms", type=limits.Limit(True, 0, 60_000).argparse_type(),
                   default=400, help="with --vad: audio kept each side of speech (default 400)")
    t.add_argument("--vad-max-speech-duration-s", type=limits.Limit(False, 0.1, None).argparse_type(),
                   default=float("inf"), help="with --vad: split longer speech (default: no limit)")
