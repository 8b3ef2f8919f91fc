"""The native command line: `candle-web transcribe|generate|models|serve ...`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .generation import option_limits as limits
from .core.errors import CandleError
from .pipelines.arguments import (add_compute_type_argument, add_transcribe_options,
                                  apply_compute_type, text_argument)


class ProgressBar:
    """A small tqdm-like bar on stderr: `label  42%|████▏     | 12.3/29.0 s [00:05<00:07]`."""

    WIDTH = 24

    def __init__(self, label: str, unit: str, stream=None):
        self.label, self.unit = label, unit
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.active = False

    def update(self, done: float, total) -> None:
        elapsed = time.perf_counter() - self.started
        if total:
            fraction = min(max(done / total, 0.0), 1.0)
            filled = int(fraction * self.WIDTH)
            bar = "█" * filled + " " * (self.WIDTH - filled)
            remaining = elapsed / fraction - elapsed if fraction > 0 else 0.0
            text = (f"\r{self.label} {fraction * 100:3.0f}%|{bar}| {self._fmt(done)}/{self._fmt(total)} "
                    f"{self.unit} [{_clock(elapsed)}<{_clock(remaining)}]")
        else:
            text = f"\r{self.label} {self._fmt(done)} {self.unit} [{_clock(elapsed)}]"
        self.stream.write(text)
        self.stream.flush()
        self.active = True

    def _fmt(self, value) -> str:
        if self.unit == "B":
            return f"{value / 1e6:.1f}M"
        return f"{value:.1f}"

    def close(self) -> None:
        if self.active:
            self.stream.write("\n")
            self.stream.flush()
            self.active = False


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def _download_progress():
    bars = {}

    def progress(done, total, filename):
        bar = bars.get(filename)
        if bar is None:
            bar = bars[filename] = ProgressBar(f"download {filename}", "B")
        bar.update(done, total)
        if total and done >= total:
            bar.close()

    return progress


# -- transcribe ----------------------------------------------------------------------------
def cmd_transcribe(args) -> int:
    from .pipelines import subtitles
    from .io.audio import load_audio
    from .pipelines.transcribe import transcribe
    from .pipelines import load_vad, load_whisper
    from .pipelines.transcribe import options_from_args

    try:
        options = options_from_args(args)
        cues = subtitles.CueOptions(args.max_line_width, args.max_line_count, args.highlight_words)
    except (CandleError, ValueError) as error:
        print(f"candle-web transcribe: {error}", file=sys.stderr)
        return 2
    apply_compute_type(args)
    loaded = load_whisper(args.model, progress=_download_progress())
    model, tokenizer = loaded.model, loaded.tokenizer
    vad_model = load_vad(progress=_download_progress()) if options.vad is not None else None
    output_dir = Path(args.output_dir) if args.output_dir else None
    if output_dir:
        output_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for path in args.files:
        try:
            samples = load_audio(path)
        except (CandleError, OSError) as error:
            print(f"candle-web: {_audio_error(path, error)}", file=sys.stderr)
            status = 1
            continue
        bar = ProgressBar(Path(path).name, "s audio")
        duration = len(samples) / 16000

        def on_event(kind, payload, bar=bar, duration=duration):
            if kind == "segment":
                bar.update(min(payload.end, duration), duration)
            elif kind == "window":
                bar.update(payload["seek_seconds"], duration)

        started = time.perf_counter()
        result = transcribe(model, tokenizer, samples, options, on_event=on_event, vad_model=vad_model)
        bar.update(duration, duration)
        bar.close()
        elapsed = time.perf_counter() - started
        rendered = subtitles.render(result, args.format, cues)
        if output_dir:
            target = output_dir / (Path(path).stem + "." + args.format)
            target.write_text(rendered, encoding="utf-8")
            print(f"wrote {target}", file=sys.stderr)
        else:
            sys.stdout.write(rendered)
        rtf = elapsed / duration if duration else 0.0
        print(f"{Path(path).name}: {duration:.1f} s of audio in {elapsed:.1f} s "
              f"(real-time factor {rtf:.3f})", file=sys.stderr)
    return status


def _audio_error(path: str, error: Exception) -> str:
    """One readable line for an audio file that could not be read, naming the path once (the
    decoders' messages usually start with it already)."""
    message = str(error)
    return message if message.startswith(f"{path}:") else f"{path}: {message}"


# -- generate ------------------------------------------------------------------------------
def chat_messages(prompt: str, system: str = None) -> list:
    """The conversation `--chat` renders: an optional system message, then the user's."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    return messages + [{"role": "user", "content": prompt}]


def cmd_generate(args) -> int:
    from .generation.chat_templates import chat_template_for
    from .generation import GenerationOptions, generate
    from .pipelines import load_llama

    if (args.top_k is not None or args.top_p is not None) and args.temperature <= 0:
        print("candle-web: note: --top-k/--top-p apply only when sampling; decoding greedily "
              "(add e.g. --temperature 0.8)", file=sys.stderr)
    if args.system is not None and not args.chat:
        print("candle-web: --system needs --chat (a system message is part of a chat)",
              file=sys.stderr)
        return 2
    constraint = None
    if args.json_schema is not None:
        try:
            constraint = _json_schema_constraint(args.json_schema)
        except (OSError, ValueError) as error:  # GrammarError is a ValueError
            print(f"candle-web: --json-schema {args.json_schema}: {error}", file=sys.stderr)
            return 2
    apply_compute_type(args)
    loaded = load_llama(args.model, progress=_download_progress())
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = args.prompt
    if args.chat:
        prompt = chat_template_for(model, tokenizer).render(chat_messages(args.prompt,
                                                                          args.system))
    options = GenerationOptions(max_new_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                repeat_penalty=args.repeat_penalty,
                                repeat_last_n=args.repeat_last_n,
                                # a chat template places BOS itself
                                add_special_tokens=not args.chat, constraint=constraint)

    def on_event(kind, payload):
        if kind == "token" and payload["text"]:
            sys.stdout.write(payload["text"])
            sys.stdout.flush()

    result = generate(model, tokenizer, prompt, options, on_event=on_event)
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(f"{len(result.prompt_ids)} prompt tokens ({result.prompt_tokens_per_second:.1f} tok/s), "
          f"{len(result.token_ids)} generated ({result.tokens_per_second:.1f} tok/s), "
          f"stopped: {result.stop_reason}", file=sys.stderr)
    return 0


# A schema is a small document; a bigger file is a mistake (or a hostile one), not a schema.
MAX_SCHEMA_BYTES = 1 << 20


def _json_schema_constraint(path: str):
    """--json-schema FILE: the answer must be JSON matching the schema in FILE (strict: no
    properties beyond the schema's), as `response_format` json_schema asks the API."""
    import json  # noqa: PLC0415

    from .generation.grammar import Constraint  # noqa: PLC0415

    with open(path, "rb") as handle:
        data = handle.read(MAX_SCHEMA_BYTES + 1)
    if len(data) > MAX_SCHEMA_BYTES:
        raise ValueError(f"larger than {MAX_SCHEMA_BYTES} bytes")
    try:
        schema = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a JSON document ({error})") from None
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema is an object")
    return Constraint.json_schema(schema, strict=True)


# -- text2text and embed -------------------------------------------------------------------
def cmd_text2text(args) -> int:
    from .generation import GenerationOptions
    from .pipelines import DEFAULT_T5, load_t5
    from .pipelines.text2text import T5TextGenerator

    loaded = load_t5(args.model or DEFAULT_T5, progress=_download_progress())
    generator = T5TextGenerator(loaded.model, loaded.tokenizer)
    options = GenerationOptions(max_new_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed)

    def on_event(kind, payload):
        if kind == "token" and payload["text"]:
            sys.stdout.write(payload["text"])
            sys.stdout.flush()

    started = time.perf_counter()
    result = generator(args.prompt, options, on_event=on_event)
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n")
    if result.truncated:
        print(f"note: the input was truncated to {result.input_tokens} tokens (the model's limit)",
              file=sys.stderr)
    print(f"{result.input_tokens} input tokens, {len(result.token_ids)} generated in "
          f"{elapsed:.2f} s, stopped: {result.stop_reason}", file=sys.stderr)
    return 0


def cmd_embed(args) -> int:
    import json

    from .pipelines import load_bert
    from .pipelines.embed import SentenceEmbedder

    loaded = load_bert(args.model, progress=_download_progress())
    embedder = SentenceEmbedder(loaded.model, loaded.tokenizer)
    result = embedder.embed(args.texts)
    for index, truncated in enumerate(result.truncated):
        if truncated:
            print(f"note: text {index + 1} was truncated to {embedder.max_tokens} tokens",
                  file=sys.stderr)
    if args.format == "json":
        rows = [{"text": text, "embedding": [round(float(x), 7) for x in vector]}
                for text, vector in zip(args.texts, result.vectors)]
        print(json.dumps(rows, ensure_ascii=False))
        return 0
    similarity = result.similarity()
    labels = [f"[{index + 1}]" for index in range(len(args.texts))]
    for label, text in zip(labels, args.texts):
        print(f"{label} {text}")
    print("     " + " ".join(f"{label:>6}" for label in labels))
    for label, row in zip(labels, similarity):
        print(f"{label:>4} " + " ".join(f"{value:6.3f}" for value in row))
    return 0


# -- faces ---------------------------------------------------------------------------------
def cmd_faces(args) -> int:
    import json

    from .pipelines.faces import (compare_faces, detector_options, find_faces,
                                  load_age_gender_net, load_descriptor_net, load_expression_net,
                                  load_face_detector, load_landmark_net)

    if bool(args.photos) == bool(args.compare):
        print("candle-web faces: give photos, or --compare A B (not both)", file=sys.stderr)
        return 2
    describe = args.describe or bool(args.compare)
    detector = load_face_detector(args.model, args.detector, progress=_download_progress())
    options = detector_options(detector, args.score_threshold)
    # The descriptor reads the face aligned by its landmarks, as face-api's chain does.
    landmark_net = (load_landmark_net(args.model, progress=_download_progress(),
                                      tiny=args.tiny_landmarks)
                    if args.landmarks or describe else None)
    expression_net = (load_expression_net(args.model, progress=_download_progress())
                      if args.expressions else None)
    descriptor_net = (load_descriptor_net(args.model, progress=_download_progress())
                      if describe else None)
    age_gender_net = (load_age_gender_net(args.model, progress=_download_progress())
                      if args.age_gender else None)
    if args.compare:
        verdict = compare_faces(*args.compare, detector, landmark_net, descriptor_net, options)
        if args.format == "json":
            print(json.dumps(verdict, ensure_ascii=False))
        else:
            relation = "<" if verdict["same_person"] else ">="
            print(f"{verdict['a']} / {verdict['b']}: distance {verdict['distance']:.3f} "
                  f"{relation} {verdict['threshold']}: "
                  f"{'the same person' if verdict['same_person'] else 'different people'}")
        return 0
    for photo in args.photos:
        result = find_faces(photo, detector, options, landmark_net, expression_net,
                            descriptor_net, age_gender_net)
        if not args.landmarks:  # found to align the descriptor's face, not asked for
            for face in result.faces:
                face.landmarks = None
        if args.format == "json":
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
            continue
        print(f"{result.file} ({result.width}x{result.height}): {len(result.faces)} "
              f"face{'' if len(result.faces) == 1 else 's'}")
        for index, face in enumerate(result.faces, start=1):
            x, y, width, height = face.box
            mood = ""
            if face.age is not None:
                mood += f"  {face.gender} {face.gender_probability:.2f}  age {face.age:.0f}"
            if face.expressions:
                top = max(face.expressions, key=face.expressions.get)
                mood += f"  {top} {face.expressions[top]:.2f}"
            print(f"  {index:>3}  x {x:7.1f}  y {y:7.1f}  w {width:7.1f}  h {height:7.1f}  "
                  f"score {face.score:.3f}{mood}", flush=True)
    return 0


# -- models --------------------------------------------------------------------------------
def cmd_models(args) -> int:
    from . import hub

    if args.verify:
        return _verify_models(hub)
    print(f"cache: {hub.cache_dir()}")
    print(f"{'name':28} {'kind':10} {'size':>9}  cached  {'licence':20}  description")
    for model in hub.list_models():
        cached = all(hub.is_cached(model.name, f.name) for f in model.files)
        print(f"{model.name:28} {model.kind:10} {model.size / 1e6:8.1f}M  {'yes' if cached else 'no ':6}  "
              f"{model.license or 'not recorded':20}  {model.description}")
        # Where each cached file came from: the Hub URL, the mirror wheel and member, or a path.
        origins = [(file.name, hub.cached_origin(model.name, file.name) or "origin not recorded")
                   for file in model.files if hub.is_cached(model.name, file.name)]
        if len(origins) > MODELS_FILES_LISTED:
            _print_origin_summary(origins)
            continue
        for name, origin in origins:
            print(f"    {name:24} from {origin}")
    return 0


# A model of more files than this (a test-data archive of a hundred) is summarised by source.
MODELS_FILES_LISTED = 8


def _print_origin_summary(origins: list) -> None:
    """One line per source archive: '115 files from pypi llama_cpp_python-0.3.36.tar.gz'."""
    counts = {}
    for _, origin in origins:
        source = origin.split(":", 1)[0]  # a mirror member's archive, or the whole origin
        counts[source] = counts.get(source, 0) + 1
    for source, count in counts.items():
        print(f"    {count} files from {source}")


def _verify_models(hub) -> int:
    """Re-hash every cached file of every registry model (hub.verify_cached), one line per
    file; exit status 1 when any was corrupt (verify_cached removed it, so the next use
    fetches it again), so that a damaged cache does not go unnoticed."""
    print(f"cache: {hub.cache_dir()}")
    corrupt = []
    for model in hub.list_models():
        report = hub.verify_cached(model.name)
        if all(state == "missing" for state in report.values()):
            print(f"{model.name:28} not cached")
            continue
        print(model.name)
        for name, state in report.items():
            detail = ""
            if state == "ok":
                detail = f" from {hub.cached_origin(model.name, name) or 'origin not recorded'}"
            elif state == "corrupt":
                detail = " (sha256 mismatch: removed, fetched again on next use)"
                corrupt.append(f"{model.name}/{name}")
            print(f"    {name:24} {state}{detail}")
    if corrupt:
        print(f"candle-web: {len(corrupt)} corrupt file(s) removed from the cache: "
              f"{', '.join(corrupt)}", file=sys.stderr)
        return 1
    return 0


def cmd_serve(args) -> int:
    import os

    from . import serve

    argv = ["--port", str(args.port), "--host", args.host]
    for folder in args.local_model:
        argv += ["--local-model", str(folder)]
    for name in args.allowed_host:
        argv += ["--allowed-host", name]
    # The OpenAI-compatible API (serve.add_api_arguments): --api, --model, --parallel, --queue;
    # the key travels through the environment, not argv (visible to other local users).
    argv += ["--api"] if args.api else []
    for model in args.model:
        argv += ["--model", model]
    for alias, target in args.alias:
        argv += ["--alias", f"{alias}={target}"]
    for flag, value in (("--parallel", args.parallel), ("--queue", args.queue),
                        ("--ray-address", args.ray_address), ("--replicas", args.replicas),
                        ("--max-audio-seconds", args.max_audio_seconds),
                        ("--drain-seconds", args.drain_seconds)):
        if value is not None:
            argv += [flag, str(value)]
    if args.compute_type is not None:
        argv += ["--compute-type", args.compute_type]
    if args.api_key:
        os.environ[serve.API_KEY_ENV_VAR] = args.api_key
    return serve.main(argv) or 0


def _sampling_arguments(parser, max_tokens: int) -> None:
    """The options generate and text2text share, range-checked as they are parsed (the same
    limits GenerationOptions applies: option_limits.py)."""
    parser.add_argument("--max-tokens", type=limits.MAX_NEW_TOKENS.argparse_type(),
                        default=max_tokens, help="new tokens at most, >= 0")
    parser.add_argument("--temperature", type=limits.TEMPERATURE.argparse_type(), default=0.0,
                        help=">= 0; 0: greedy (default)")
    parser.add_argument("--top-k", type=limits.TOP_K.argparse_type(), default=None,
                        help=">= 1 (sampling only)")
    parser.add_argument("--top-p", type=limits.TOP_P.argparse_type(), default=None,
                        help="in (0, 1]; 1 keeps every token (sampling only)")
    parser.add_argument("--seed", type=limits.SEED.argparse_type(), default=299792458,
                        help="sampling seed, >= 0 (default %(default)s: the same text on "
                             "every run; `serve --api` instead draws a fresh seed per "
                             "request without one)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="candle-web", description="Run published models with candle-web.")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("transcribe", help="speech to text with Whisper")
    t.add_argument("files", nargs="+", help="audio files (WAV natively; mp3/flac/ogg via soundfile or ffmpeg)")
    t.add_argument("--model", default="whisper-tiny.en",
                   help="registry name, a model folder, or a Hub faster-whisper export "
                        "org/name@revision (online)")
    t.add_argument("--format", default="txt", choices=("txt", "srt", "vtt", "json"))
    t.add_argument("--output-dir", default=None, help="write FILE.<format> here instead of stdout")
    add_transcribe_options(t)
    add_compute_type_argument(t)
    t.set_defaults(func=cmd_transcribe)

    g = sub.add_parser("generate", help="text generation with a LLaMA-family model")
    g.add_argument("prompt", type=text_argument("prompt"), help="the prompt text (with --chat: the user message)")
    g.add_argument("--model", default="smollm2-135m-instruct",
                   help="registry name, a .gguf file or an HF model folder")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", default=None, type=text_argument("--system"),
                   help="with --chat: a system message before the prompt")
    _sampling_arguments(g, max_tokens=256)
    g.add_argument("--repeat-penalty", type=limits.REPEAT_PENALTY.argparse_type(), default=1.0,
                   help="> 0; 1.0: off")
    g.add_argument("--repeat-last-n", type=limits.REPEAT_LAST_N.argparse_type(), default=64,
                   help="tokens the penalty looks back over, >= 0")
    g.add_argument("--json-schema", default=None, metavar="FILE",
                   help="answer JSON matching the JSON schema in FILE (constrained decoding; "
                        "needs the grammar extra)")
    add_compute_type_argument(g)
    g.set_defaults(func=cmd_generate)

    x = sub.add_parser("text2text", help="text-to-text with T5 (translate, summarize, flan instructions)")
    x.add_argument("prompt", type=text_argument("prompt"), help='the input with its task prefix, e.g. "translate English to German: Hello"')
    x.add_argument("--model", default=None,
                   help="a folder (config.json, model.safetensors or .gguf, tokenizer.json), a registry "
                        "name (t5-small, flan-t5-small: Hub commits, online), or a Hub repo org/name@revision "
                        "(default: t5-small)")
    _sampling_arguments(x, max_tokens=64)
    x.set_defaults(func=cmd_text2text)

    e = sub.add_parser("embed", help="sentence embeddings with BERT (all-MiniLM-L6-v2)")
    e.add_argument("texts", nargs="+", type=text_argument("texts"), help="one or more sentences")
    e.add_argument("--model", default="all-minilm-l6-v2", help="registry name or a model folder")
    e.add_argument("--format", default="json", choices=("json", "matrix"),
                   help="json: the vectors; matrix: pairwise cosine similarities")
    e.set_defaults(func=cmd_embed)

    f = sub.add_parser("faces", help="find faces in photos (face-api's networks)")
    f.add_argument("photos", nargs="*", help="photo files (JPEG, PNG, WebP...)")
    f.add_argument("--detector", default="tiny", choices=("tiny", "ssd"),
                   help="tiny: face-api's tiny face detector at 416 px; ssd: SSD MobileNet v1 "
                        "at 512 px (slower, finds smaller faces)")
    f.add_argument("--score-threshold", type=float, default=0.5,
                   help="the score a box needs to count as a face (0..1, default 0.5)")
    f.add_argument("--landmarks", action="store_true",
                   help="add each face's 68 landmarks (face-api's face_landmark_68 net)")
    f.add_argument("--tiny-landmarks", action="store_true",
                   help="find landmarks (for --landmarks, and to align --describe's faces) "
                        "with face-api's tiny 68-point net: faster, less precise")
    f.add_argument("--expressions", action="store_true",
                   help="add each face's expression probabilities (neutral, happy, sad, angry, "
                        "fearful, disgusted, surprised)")
    f.add_argument("--describe", action="store_true",
                   help="add each face's 128-number descriptor (face-api's face_recognition "
                        "net): two faces closer than 0.6 are the same person")
    f.add_argument("--age-gender", action="store_true",
                   help="add each face's age, gender and gender_probability")
    f.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="instead of photos: whether the best face of photo A and of photo B "
                        "are the same person, with their descriptors' distance")
    f.add_argument("--model", default="face-api",
                   help="registry name or a folder of face-api's model files")
    f.add_argument("--format", default="json", choices=("json", "table"),
                   help="json: one object per photo per line; table: one line per face")
    f.set_defaults(func=cmd_faces)

    m = sub.add_parser("models", help="list the models the registry knows and what is cached")
    m.add_argument("--verify", action="store_true",
                   help="re-hash every cached file against its sha256 (exit status 1 if any is "
                        "corrupt; corrupt files are removed and fetched again on next use)")
    m.set_defaults(func=cmd_models)

    s = sub.add_parser("serve", help="serve the demo page on 127.0.0.1")
    s.add_argument("--port", type=limits.PORT.argparse_type(), default=8000,
                   help="0..65535 (0: any free port)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--local-model", action="append", default=[], metavar="DIR",
                   help="also serve model folder DIR under /models/local/<DIR's name>/ "
                        "(e.g. a T5 for the Text-to-text view); repeatable")
    from .serve import add_api_arguments, add_drain_arguments, add_host_arguments  # stdlib-only
    add_host_arguments(s)
    add_drain_arguments(s)
    add_api_arguments(s)
    add_compute_type_argument(s)
    s.set_defaults(func=cmd_serve)

    # `batch transcribe|embed`: the same model/decoding options on Ray (imported when run).
    from .batch.command import add_batch_command
    add_batch_command(sub, transcribe=t, embed=e, download_progress=_download_progress)
    # `chat`: the interactive terminal chat (chat.py).
    from .chat import add_chat_command
    add_chat_command(sub, _sampling_arguments, text_argument, _download_progress,
                     add_compute_type_argument)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CandleError as error:
        print(f"candle-web: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # an unwritable --output-dir, a full disk...: a line, no traceback
        print(f"candle-web: {error}", file=sys.stderr)
        return 1
    except MemoryError:
        print("candle-web: out of memory (try a smaller model or option values)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("candle-web: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
