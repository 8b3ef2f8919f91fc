"""The worker's Whisper commands on the Python side: registry look-ups, model building from
bytes the worker streamed into buffers allocated here, and transcription with streamed events.

Imported by web/worker.js inside Pyodide (written into its file system); importable natively
too (the UI tests and bench/browser.py use `model_manifest` and `transcript_payload` to mirror
exactly what the browser does).

Bytes reach Python without extra copies: `allocate_file` hands the worker a numpy uint8 array
of the registry's size, the worker writes each downloaded chunk straight into its memory (the
one copy from the JS heap into the wasm heap that cannot be avoided), checks the sha256 on that
same memory, and `build_model` parses it through a memoryview (np.frombuffer inside the CT2
reader). Audio samples arrive the same way as a float32 buffer.
"""
from __future__ import annotations

import hashlib
import json
import time

import numpy as np

import model_files

WHISPER_KIND = "whisper"
MODEL_FILE = "model.bin"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)
# Files fetched for a Hub repo the registry does not know (a faster-whisper CT2 export).
SAMPLE_RATE = 16_000
MAX_AUDIO_SECONDS = 4 * 60 * 60  # 4 h of f32 samples is 920 MB: beyond that, refuse early
TRANSCRIBE_OPTION_NAMES = (
    "language", "task", "beam_size", "best_of", "patience", "compression_ratio_threshold",
    "logprob_threshold", "no_speech_threshold", "condition_on_previous_text",
    "initial_prompt", "without_timestamps",
)
EXPORT_FORMATS = ("txt", "srt", "vtt", "json")

# The one model kept in memory (a second one would double the heap; switching rebuilds).
_loaded: dict = {}


# --- registry ------------------------------------------------------------------------------

def _registry():
    from candle_web import hub

    return hub.default_registry()


def browser_models() -> str:
    """JSON list of the registry's Whisper models that may run in the browser."""
    from candle_web import hub

    models = []
    for entry in hub.list_models(_registry(), kind=WHISPER_KIND):
        if not entry.browser:
            continue
        models.append({"name": entry.name, "description": entry.description,
                       "size": entry.size, "license": entry.license})
    return json.dumps(models)


def _hf_source(entry) -> dict | None:
    for source in entry.sources:
        if "hf" in source:
            return source["hf"]
    return None


def model_manifest(model: str | None = None, hf_repo: str | None = None,
                   revision: str | None = None) -> dict:
    """What the worker fetches for a `load`: {key, files: [{name, size, sha256, url}]}.

    A registry name is served by candle-web serve under /models/<name>/<file>. A Hub
    repo/revision resolves to https://huggingface.co/<repo>/resolve/<revision>/<file>; when the
    registry pins that very revision its sizes and hashes are checked, otherwise the files are
    taken as the Hub serves them (sha256 null: not verifiable) and the revision must be a
    full commit hash so that the bytes cannot change under the same name.
    """
    from candle_web.errors import ModelNotFound

    registry = _registry()
    if model is not None:
        if model not in registry:
            known = [e.name for e in registry if e.kind == WHISPER_KIND and e.browser]
            raise ModelNotFound(f"load: no registry model {model!r}; browser Whisper models: "
                                f"{', '.join(known)}")
        entry = registry[model]
        if entry.kind != WHISPER_KIND or not entry.browser:
            raise ModelNotFound(f"load: registry model {model!r} is a {entry.kind} model "
                                f"{'' if entry.browser else 'not shipped to browsers '}"
                                "and cannot be transcribed with here")
        files = [{"name": f.name, "size": f.size, "sha256": f.sha256,
                  "url": f"models/{entry.name}/{f.name}"} for f in entry.files]
        return {"key": entry.name, "source": "server", "files": files}
    return _hub_manifest(registry, hf_repo, revision)


def _hub_manifest(registry, hf_repo, revision) -> dict:
    from candle_web import hub
    from candle_web.errors import ModelNotFound

    if not isinstance(hf_repo, str) or not hub._REPO_RE.match(hf_repo):
        raise ModelNotFound(f"load: hf_repo must look like 'owner/name', got {hf_repo!r}")
    if not isinstance(revision, str) or not hub._REVISION_RE.match(revision):
        raise ModelNotFound(f"load: revision must be a branch, tag or commit, got {revision!r}")
    base = f"{hub.DEFAULT_HF_ENDPOINT}/{hf_repo}/resolve/{revision}/"
    for entry in registry:
        source = _hf_source(entry)
        if entry.kind == WHISPER_KIND and source == {"repo": hf_repo, "revision": revision}:
            files = [{"name": f.name, "size": f.size, "sha256": f.sha256, "url": base + f.name}
                     for f in entry.files]
            return {"key": f"{hf_repo}@{revision}", "source": "hub", "files": files}
    if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
        raise ModelNotFound(f"load: {hf_repo}@{revision} is not in the registry; pin a full "
                            "40-character commit hash so the files cannot change")
    files = [{"name": name, "size": None, "sha256": None, "url": base + name}
             for name in REQUIRED_FILES]
    return {"key": f"{hf_repo}@{revision}", "source": "hub", "files": files}


def manifest_json(model=None, hf_repo=None, revision=None) -> str:
    return json.dumps(model_manifest(model, hf_repo, revision))


# --- bytes in -------------------------------------------------------------------------------

# The staging of incoming bytes is the text models' (model_files): the same size checks and
# the same buffers for every model kind.
allocate_file = model_files.allocate_file
discard_incoming = model_files.discard_incoming


def build_model(key: str) -> str:
    """Build Whisper + tokenizer from the staged buffers; JSON summary of the model."""
    from candle_web.errors import FormatError
    from candle_web.models.whisper import Whisper
    from candle_web.tokenizers import Tokenizer

    staged = model_files.take_staged(key, REQUIRED_FILES)
    try:
        _loaded.clear()  # free the previous model before building the next one
        started = time.perf_counter()
        try:
            config = json.loads(staged[CONFIG_FILE].tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise FormatError(f"load: {key}/{CONFIG_FILE} is not JSON: {error}") from None
        if not isinstance(config, dict):
            raise FormatError(f"load: {key}/{CONFIG_FILE} must hold a JSON object")
        model = Whisper.from_ct2(memoryview(staged[MODEL_FILE]), config)
        tokenizer = Tokenizer.from_bytes(memoryview(staged[TOKENIZER_FILE]))
        build_ms = (time.perf_counter() - started) * 1000.0
    finally:
        staged.clear()  # the f32 weights are copies: the raw bytes can go
    _loaded.clear()
    _loaded[key] = (model, tokenizer)
    cfg = model.config
    return json.dumps({"key": key, "buildMs": build_ms, "multilingual": cfg.is_multilingual,
                       "nMels": cfg.n_mels, "dModel": cfg.d_model, "vocab": cfg.n_vocab,
                       "audioLayers": cfg.n_audio_layer, "textLayers": cfg.n_text_layer})


def loaded_model(key: str):
    from candle_web.errors import ModelNotFound

    if key not in _loaded:
        have = ", ".join(_loaded) or "none"
        raise ModelNotFound(f"transcribe: model {key!r} is not loaded (loaded: {have}); "
                            "send `load` first")
    return _loaded[key]


# --- transcription ----------------------------------------------------------------------------

class TimedWhisper:
    """The model seen by whisper_decode, timing the encoder and each decoder call.

    transcribe() and WindowDecoder use only config, device, encode, start_decoding and logits."""

    def __init__(self, model):
        self._model = model
        self.config = model.config
        self.device = model.device  # whisper_decode creates its inputs on the model's device
        self.encode_ms = 0.0
        self.decode_ms = 0.0
        self.decoder_calls = 0

    def encode(self, mel):
        started = time.perf_counter()
        try:
            return self._model.encode(mel)
        finally:
            self.encode_ms += (time.perf_counter() - started) * 1000.0

    def start_decoding(self, audio_features):
        started = time.perf_counter()
        try:
            return self._model.start_decoding(audio_features)
        finally:
            self.decode_ms += (time.perf_counter() - started) * 1000.0

    def logits(self, tokens, state, positions=None):
        started = time.perf_counter()
        try:
            if positions is None:
                return self._model.logits(tokens, state)
            return self._model.logits(tokens, state, positions)  # only the rows decoding reads
        finally:
            self.decode_ms += (time.perf_counter() - started) * 1000.0
            self.decoder_calls += 1


def transcribe_options(options: dict | None):
    """TranscribeOptions from the page's plain dict; unknown names are refused."""
    from candle_web.errors import UnsupportedError
    from candle_web.models.whisper_decode import TranscribeOptions

    options = dict(options or {})
    unknown = sorted(set(options) - set(TRANSCRIBE_OPTION_NAMES) - {"temperatures"})
    if unknown:
        raise UnsupportedError(f"transcribe: unknown option(s) {', '.join(unknown)}; known: "
                               f"{', '.join(TRANSCRIBE_OPTION_NAMES + ('temperatures',))}")
    if "temperatures" in options:
        options["temperatures"] = tuple(float(t) for t in options["temperatures"])
    return TranscribeOptions(**{k: v for k, v in options.items() if v is not None})


def allocate_samples(count: int) -> np.ndarray:
    """A float32 buffer for `count` samples, which the worker fills from the page's array."""
    from candle_web.errors import FormatError

    if isinstance(count, bool) or not isinstance(count, (int, float)) or count != int(count) \
            or not 0 < int(count) <= MAX_AUDIO_SECONDS * SAMPLE_RATE:
        raise FormatError(f"transcribe: {count!r} samples: expected 1..{MAX_AUDIO_SECONDS} s "
                          f"of 16 kHz audio")
    return np.empty(int(count), dtype=np.float32)


def samples_from_buffer(buffer) -> np.ndarray:
    """float32 samples over bytes (a memoryview of the transferred buffer), validated."""
    from candle_web.errors import FormatError

    view = memoryview(buffer).cast("B")
    if view.nbytes == 0:
        raise FormatError("transcribe: no audio samples (empty buffer)")
    if view.nbytes % 4:
        raise FormatError(f"transcribe: {view.nbytes} bytes is not a whole number of float32 "
                          "samples")
    count = view.nbytes // 4
    if count > MAX_AUDIO_SECONDS * SAMPLE_RATE:
        raise FormatError(f"transcribe: {count / SAMPLE_RATE:.0f} s of audio is more than the "
                          f"{MAX_AUDIO_SECONDS} s the page accepts")
    samples = np.frombuffer(view, dtype="<f4")
    if not np.all(np.isfinite(samples)):
        raise FormatError("transcribe: the samples contain NaN or infinity")
    return samples


def segment_payload(segment) -> dict:
    return {"id": segment.id, "start": segment.start, "end": segment.end,
            "text": segment.text, "tokens": [int(t) for t in segment.tokens],
            "temperature": segment.temperature, "avgLogprob": segment.avg_logprob,
            "noSpeechProb": segment.no_speech_prob}


def transcript_payload(transcript) -> dict:
    """The parts of a Transcript the page shows and the tests compare (also used natively)."""
    from candle_web import subtitles

    return {"text": transcript.text, "language": transcript.language,
            "duration": transcript.duration,
            "segments": [segment_payload(s) for s in transcript.segments],
            "exports": {fmt: subtitles.render(transcript, fmt) for fmt in EXPORT_FORMATS}}


PROFILE_TOP_FUNCTIONS = 25


def profile_report(profiler) -> list:
    """The functions with the most own time: [{function, calls, ownMs, cumulativeMs}]."""
    import pstats

    stats = pstats.Stats(profiler)
    rows = []
    for (file_name, line, name), (_, calls, own, cumulative, _) in stats.stats.items():
        short_file = file_name.replace("\\", "/").split("/site-packages/")[-1]
        rows.append({"function": f"{short_file}:{line}({name})", "calls": calls,
                     "ownMs": own * 1000.0, "cumulativeMs": cumulative * 1000.0})
    rows.sort(key=lambda row: row["ownMs"], reverse=True)
    return rows[:PROFILE_TOP_FUNCTIONS]


def transcribe(key: str, buffer, options=None, on_event=None, profile: bool = False) -> str:
    """Transcribe float32 16 kHz mono samples with the loaded model `key`.

    on_event(kind, json_text) streams "language", "window", "token" (with the token's text)
    and "segment" events; the return value is the JSON of the final result. profile=True
    runs under cProfile (slower) and adds the top functions by own time (bench/browser.py)."""
    from candle_web.models.whisper_decode import transcribe as whisper_transcribe

    model, tokenizer = loaded_model(key)
    if options is not None and hasattr(options, "to_py"):
        options = options.to_py()  # a JS object from the worker
    opts = transcribe_options(options)
    samples = samples_from_buffer(buffer)
    digest = hashlib.sha256(samples.tobytes()).hexdigest()
    timed = TimedWhisper(model)
    timestamp_begin = tokenizer.token_to_id("<|notimestamps|>") + 1
    eot = tokenizer.token_to_id("<|endoftext|>")
    counters = {"tokens": 0, "windows": 0}

    def forward(kind, payload):
        if on_event is None:
            return
        if kind == "segment":
            message = segment_payload(payload)
        elif kind == "token":
            token = int(payload["token"])
            counters["tokens"] += 1
            text = ""
            if token < eot:  # text pieces only: no timestamps or special tokens
                text = tokenizer.decode([token], skip_special_tokens=True)
            message = {"step": int(payload["step"]), "token": token, "text": text,
                       "timestamp": token >= timestamp_begin}
        else:
            if kind == "window":
                counters["windows"] += 1
            message = dict(payload)
        on_event(kind, json.dumps(message))

    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    try:
        transcript = whisper_transcribe(timed, tokenizer, samples, opts, on_event=forward)
    finally:
        if profiler is not None:
            profiler.disable()
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    result = transcript_payload(transcript)
    if profiler is not None:
        result["profile"] = profile_report(profiler)
    duration = transcript.duration
    result["timings"] = {
        "elapsedMs": elapsed_ms, "audioSeconds": duration,
        "rtf": (elapsed_ms / 1000.0) / duration if duration > 0 else None,
        "encodeMs": timed.encode_ms, "decodeMs": timed.decode_ms,
        "decoderCalls": timed.decoder_calls, "windows": len(transcript.windows),
    }
    result["input"] = {"samples": int(samples.size), "sha256": digest}
    return json.dumps(result)
