"""`candle-web batch transcribe|embed`: the argparse side (cli.py adds it in one call).

The model and decoding options are the single-file commands' own argparse actions, shared, so
`batch transcribe` takes exactly what `transcribe` takes; TRANSCRIBE_OPTIONS maps them onto
TranscribeOptions the way cmd_transcribe does (a test fails when transcribe gains an option this
mapping does not know)."""

from __future__ import annotations

import sys

SHARED_EXCLUDED = {"help", "files", "texts", "format", "output_dir", "func"}
# The transcribe options batch passes on; each is turned into TranscribeOptions below.
TRANSCRIBE_OPTIONS = {"model", "language", "task", "beam_size", "initial_prompt",
                      "without_timestamps", "no_fallback", "temperature",
                      "temperature_increment_on_fallback", "condition_on_previous_text",
                      "compression_ratio_threshold", "logprob_threshold", "no_speech_threshold",
                      "word_timestamps", "prepend_punctuations", "append_punctuations",
                      "highlight_words", "max_line_width", "max_line_count", "vad",
                      "vad_threshold", "vad_min_speech_duration_ms", "vad_min_silence_duration_ms",
                      "vad_speech_pad_ms", "vad_max_speech_duration_s", "compute_type"}
EMBED_OPTIONS = {"model"}


def add_batch_command(subparsers, *, transcribe, embed, download_progress=None) -> None:
    """Add `batch` with its two subcommands to the CLI's subparsers, sharing the option actions
    of the `transcribe` and `embed` parsers."""
    batch = subparsers.add_parser(
        "batch", help="many inputs on a Ray cluster (pip install 'candle-web[cluster]')",
        description="Run transcribe or embed over many inputs with Ray Data: resumable (a rerun "
                    "skips what is written), failures go to an errors table.")
    tasks = batch.add_subparsers(dest="batch_task", required=True)

    t = tasks.add_parser("transcribe", help="transcribe many audio files into a Parquet dataset")
    t.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="audio files, folders (searched recursively), globs, or .txt/.lst list "
                        "files with one path a line")
    _share_options(transcribe, t)
    t.add_argument("--format", action="append", default=[], dest="formats",
                   choices=("txt", "srt", "vtt", "json"),
                   help="also write OUT/transcripts/NAME.FORMAT for each file; repeatable")
    _cluster_arguments(t)
    t.set_defaults(func=lambda args: cmd_batch_transcribe(args, download_progress))

    e = tasks.add_parser("embed", help="embed every line of JSON Lines files into a Parquet dataset")
    e.add_argument("inputs", nargs="+", metavar="TEXTS.jsonl",
                   help='JSON Lines: {"text": "...", "id": "..."} (id optional) or a JSON string a line')
    _share_options(embed, e)
    _cluster_arguments(e)
    e.set_defaults(func=lambda args: cmd_batch_embed(args, download_progress))


def shared_dests(parser) -> set:
    return {action.dest for action in parser._actions if action.dest not in SHARED_EXCLUDED}


def _share_options(source, target) -> None:
    # The same Action objects, as argparse's own `parents=` shares them.
    for action in source._actions:
        if action.dest not in SHARED_EXCLUDED and action.option_strings:
            target._add_action(action)


def _cluster_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder: OUT/results (Parquet, partitioned by status; "
                             "status=error is the errors table); reruns resume there")
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS",
                        help="join this Ray cluster (host:port of its head; default: $RAY_ADDRESS, "
                             "else a local Ray sized to this machine)")
    parser.add_argument("--concurrency", type=_positive_int, default=None, metavar="N",
                        help="model actors (default: the cluster's CPUs / --cpus-per-actor)")
    parser.add_argument("--cpus-per-actor", type=_positive_float, default=1.0, metavar="C",
                        help="CPUs Ray reserves for each actor (default 1)")
    parser.add_argument("--threads-per-actor", type=_positive_int, default=None, metavar="T",
                        help="kernel threads of each actor (NUMBA_NUM_THREADS; default: the "
                             "node's default, as the single-file command uses, so results are "
                             "identical to it; with several actors a node, T x actors <= cores "
                             "runs faster, and log-probabilities move in the 7th digit)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="try inputs again whose earlier attempt is in the errors table")
    parser.add_argument("--verbose", action="store_true", help="show Ray's own logs and progress")


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def transcribe_options(args):
    """TranscribeOptions from the shared transcribe arguments, as cmd_transcribe builds them."""
    from ..core.errors import InvalidOption
    from ..pipelines.transcribe import options_from_args

    # The results table keeps segments, not words: the per-file SRT/VTT are one cue a segment.
    for name in ("highlight_words", "max_line_width", "max_line_count"):
        if getattr(args, name, None):
            raise InvalidOption(f"batch transcribe writes one subtitle cue per segment: "
                                f"--{name.replace('_', '-')} is for `candle-web transcribe`")
    return options_from_args(args)


def _cluster(args):
    from .runner import ClusterOptions

    return ClusterOptions(address=args.ray_address, concurrency=args.concurrency,
                          cpus_per_actor=args.cpus_per_actor,
                          threads_per_actor=args.threads_per_actor, verbose=args.verbose)


def _finish(summary) -> int:
    for line in summary.lines():
        print(line, file=sys.stderr)
    return 1 if summary.errors or summary.missing else 0


def cmd_batch_transcribe(args, download_progress=None) -> int:
    from .runner import transcribe_many

    from ..backend.settings import settings

    # --compute-type, else this process's setting (CANDLE_WEB_COMPUTE_TYPE): each actor sets it
    # before it loads the model.
    compute_type = getattr(args, "compute_type", None) or settings().compute_type
    summary = transcribe_many(args.inputs, args.out, model=args.model, compute_type=compute_type,
                              options=transcribe_options(args), formats=list(dict.fromkeys(args.formats)),
                              cluster=_cluster(args), retry_errors=args.retry_errors,
                              download_progress=download_progress() if download_progress else None)
    return _finish(summary)


def cmd_batch_embed(args, download_progress=None) -> int:
    from .runner import embed_many

    summary = embed_many(args.inputs, args.out, model=args.model, cluster=_cluster(args),
                         retry_errors=args.retry_errors,
                         download_progress=download_progress() if download_progress else None)
    return _finish(summary)
