"""The Transcribe view's session: Whisper (CTranslate2 model.bin + config.json + tokenizer.json)
built from the staged files, then transcription of float32 16 kHz mono samples with streamed
language, window, token and segment events.

Audio arrives like the model files: `allocate_samples` hands the worker a float32 array, the
worker copies the page's transferred samples into it, and `compute` reads it in place.
Natively, tests/ui/native_whisper.py (and bench/browser.py through it) uses
`transcribe_options` and `transcript_payload` to build the very payload the browser shows.

A run can be one window of a longer recording (the page's live mode): `offset` is where its
samples start in the recording (added to every segment's times) and `prior` the segments
already final before it, which the result keeps in front of its own (text, segments and
exports then cover the whole recording).
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from candle_web.core.errors import FormatError, UnsupportedError, check_text
from candle_web.worker.session import (CONFIG_FILE, TOKENIZER_FILE, Profiler, Session,
                                       python_value)

MODEL_FILE = "model.bin"
SAMPLE_RATE = 16_000
MAX_AUDIO_SECONDS = 4 * 60 * 60  # 4 h of f32 samples is 920 MB: beyond that, refuse early
TRANSCRIBE_OPTION_NAMES = (
    "language", "task", "beam_size", "best_of", "patience", "compression_ratio_threshold",
    "logprob_threshold", "no_speech_threshold", "condition_on_previous_text",
    "initial_prompt", "without_timestamps", "temperatures", "word_timestamps", "vad",
)
EXPORT_FORMATS = ("txt", "srt", "vtt", "json")
# A prior segment spans at least one timestamp step (20 ms): more than this many cannot come
# from MAX_AUDIO_SECONDS of audio.
MAX_PRIOR_SEGMENTS = MAX_AUDIO_SECONDS * 50


class WhisperSession(Session):
    kind = "whisper"
    command = "transcribe"
    # What a Hub repo the registry does not know must hold: a faster-whisper CT2 export.
    required_files = (MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE)
    _live = None  # the live recording: {recording, transcriber, timed, passMs} (live_step)

    def build(self, files: dict) -> tuple:
        """(Whisper, Tokenizer) from the received files, opened as pipelines.load_whisper
        opens a folder (io/checkpoint.py)."""
        from candle_web.pipelines import load_whisper

        loaded = load_whisper(files)
        return loaded.model, loaded.tokenizer

    def describe(self, model) -> dict:
        cfg = model[0].config
        return {"multilingual": cfg.is_multilingual, "nMels": cfg.n_mels, "dModel": cfg.d_model,
                "vocab": cfg.n_vocab, "audioLayers": cfg.n_audio_layer,
                "textLayers": cfg.n_text_layer}

    @staticmethod
    def allocate_samples(count) -> np.ndarray:
        """A float32 buffer for `count` samples, which the worker fills from the page's array."""
        if isinstance(count, bool) or not isinstance(count, (int, float)) \
                or count != int(count) or not 0 < int(count) <= MAX_AUDIO_SECONDS * SAMPLE_RATE:
            raise FormatError(f"transcribe: {count!r} samples: expected 1..{MAX_AUDIO_SECONDS} s "
                              "of 16 kHz audio")
        return np.empty(int(count), dtype=np.float32)

    def compute(self, model, samples=None, options=None, profile: bool = False,
                offset=None, prior=None, live=None, kept=None, on_event=None) -> dict:
        """Transcribe the samples (bytes-like, float32). on_event(kind, payload) sees
        "language", "window", "token" (with the token's text) and "segment" events.
        profile=True runs under cProfile (slower) and adds the top functions by own time
        (bench/browser.py). offset (seconds) and prior (segment payloads) place the samples
        in a longer recording (see the module doc). live: a step of a live recording (the
        page's `live` command, see live_step). kept: {segments, duration, language} of a
        transcription stopped part-way: their transcript and exports, nothing decoded (the
        page offers what was heard before Cancel)."""
        from candle_web.pipelines.transcribe import transcribe

        if live is not None:
            return self.live_step(model, live, samples, options, offset, on_event)
        if kept is not None:
            return kept_payload(kept, model[0].config.n_vocab)
        whisper, tokenizer = model
        opts = transcribe_options(options)
        offset = checked_offset(offset)
        prior = prior_segments(prior, whisper.config.n_vocab)
        samples = samples_from_buffer(samples)
        digest = hashlib.sha256(samples.tobytes()).hexdigest()
        timed = TimedWhisper(whisper)
        forward = _event_forwarder(tokenizer, on_event, offset, len(prior))
        profiler = Profiler(profile)
        started = time.perf_counter()
        with profiler:
            transcript = transcribe(timed, tokenizer, samples, opts, on_event=forward,
                                    vad_model=_vad_model() if opts.vad is not None else None)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        duration = transcript.duration  # of these samples: what the timings are about
        if offset or prior:
            transcript = placed_transcript(transcript, tokenizer, offset, prior)
        result = transcript_payload(transcript)
        if profile:
            result["profile"] = profiler.report()
        result["timings"] = {
            "elapsedMs": elapsed_ms, "audioSeconds": duration,
            "rtf": (elapsed_ms / 1000.0) / duration if duration > 0 else None,
            "encodeMs": timed.encode_ms, "decodeMs": timed.decode_ms,
            "decoderCalls": timed.decoder_calls, "windows": len(transcript.windows),
        }
        result["input"] = {"samples": int(samples.size), "sha256": digest}
        return result

    def live_step(self, model, live, samples=None, options=None, offset=None,
                  on_event=None) -> dict:
        """One step of a live recording, the policy being pipelines.transcribe's
        LiveTranscriber: live = {recording: a positive int the page picks, action}.
        "start" begins the recording with `options` (no samples); "pass" runs a pass over the
        samples heard from `offset` seconds on, when enough are new; "stop" runs the last
        pass over the rest (`samples` from `offset` to the recording's end) and returns the
        transcript of the whole recording, with timings over all its passes. Every reply
        carries `live`: the recording's state for the page to show (live_payload)."""
        from candle_web.pipelines.transcribe import LiveTranscriber

        whisper, tokenizer = model
        recording, action = live_request(live)
        if action == "start":
            timed = TimedWhisper(whisper)
            self._live = {"recording": recording, "timed": timed, "passMs": 0.0,
                          "transcriber": LiveTranscriber(timed, tokenizer,
                                                         _without_vad(transcribe_options(options)))}
            return {"live": live_payload(self._live, None)}
        state = self._live
        if state is None or state["recording"] != recording:
            raise FormatError(f"live: recording {recording} was not started (send action "
                              "'start' first)")
        transcriber = state["transcriber"]
        samples = samples_from_buffer(samples)
        start = checked_offset(offset)
        forward = _event_forwarder(tokenizer, on_event, transcriber.window_start,
                                   len(transcriber.final) if action == "stop" else 0)
        started = time.perf_counter()
        if action == "pass":
            done = transcriber.step(samples, start, on_event=forward)
            state["passMs"] += (time.perf_counter() - started) * 1000.0
            return {"live": live_payload(state, done)}
        transcript = transcriber.finish(samples, start, on_event=forward)
        last_ms = (time.perf_counter() - started) * 1000.0
        state["passMs"] += last_ms
        self._live = None
        result = transcript_payload(transcript)
        result["timings"] = {
            "elapsedMs": state["passMs"], "audioSeconds": transcript.duration,
            "rtf": state["passMs"] / 1000.0 / transcript.duration
            if transcript.duration > 0 else None,
            "lastPassMs": last_ms, "encodeMs": state["timed"].encode_ms,
            "decodeMs": state["timed"].decode_ms, "decoderCalls": state["timed"].decoder_calls,
            "windows": len(transcript.windows),
        }
        result["live"] = live_payload(state, None)
        return result

def transcribe_options(options):
    """TranscribeOptions from the page's plain dict; unknown names are refused."""
    from candle_web.pipelines.transcribe import TranscribeOptions

    options = dict(python_value(options) or {})
    unknown = sorted(set(options) - set(TRANSCRIBE_OPTION_NAMES))
    if unknown:
        raise UnsupportedError(f"transcribe: unknown option(s) {', '.join(unknown)}; known: "
                               f"{', '.join(TRANSCRIBE_OPTION_NAMES)}")
    if "temperatures" in options:
        options["temperatures"] = tuple(float(t) for t in options["temperatures"])
    if "vad" in options:  # true: faster-whisper's defaults; an object: VadOptions fields
        from candle_web.models.silero_vad import VadOptions

        vad = options["vad"]
        if vad is True:
            options["vad"] = VadOptions()
        elif isinstance(vad, dict):
            fields = set(VadOptions.__dataclass_fields__)
            if set(vad) - fields:
                raise UnsupportedError(f"transcribe: unknown vad option(s) "
                                       f"{', '.join(sorted(set(vad) - fields))}; known: {', '.join(sorted(fields))}")
            options["vad"] = VadOptions(**vad)
        elif vad is False:
            options["vad"] = None
        else:
            raise FormatError(f"transcribe: option vad must be true, false or an object, got {vad!r}")
    for name in ("initial_prompt", "language", "task"):
        if isinstance(options.get(name), str):  # a JS string may carry lone UTF-16 halves
            check_text(options[name], f"transcribe: option {name}")
    return TranscribeOptions(**{k: v for k, v in options.items() if v is not None})


def _without_vad(options):
    """Live passes read short open windows (LiveTranscriber): they run without the VAD."""
    from dataclasses import replace

    return replace(options, vad=None)


def _vad_model():
    """The VAD the page loaded beside Whisper (`load` with kind "vad")."""
    from candle_web.worker import session_for

    return session_for("vad").current()


def samples_from_buffer(buffer) -> np.ndarray:
    """float32 samples over bytes (a memoryview of the transferred buffer), validated."""
    if buffer is None:
        raise FormatError("transcribe: no audio samples (empty buffer)")
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


def checked_offset(offset) -> float:
    """The samples' start in the recording, in seconds (None: 0)."""
    if offset is None:
        return 0.0
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) \
            or not 0 <= offset <= MAX_AUDIO_SECONDS:
        raise FormatError(f"transcribe: offset must be a number of seconds from 0 to "
                          f"{MAX_AUDIO_SECONDS}, got {offset!r}")
    return float(offset)


LIVE_ACTIONS = ("start", "pass", "stop")
MAX_RECORDING_ID = 2**31 - 1


def live_request(live) -> tuple:
    """(recording, action) from the page's `live` field, each checked."""
    live = python_value(live)
    if not isinstance(live, dict):
        raise FormatError(f"live: expected {{recording, action}}, got {live!r}")
    recording, action = live.get("recording"), live.get("action")
    if isinstance(recording, bool) or not isinstance(recording, int) \
            or not 0 < recording <= MAX_RECORDING_ID:
        raise FormatError(f"live: recording must be an integer from 1 to {MAX_RECORDING_ID}, "
                          f"got {recording!r}")
    if action not in LIVE_ACTIONS:
        raise FormatError(f"live: action must be one of {', '.join(LIVE_ACTIONS)}, got "
                          f"{action!r}")
    return recording, action


def live_payload(state: dict, done) -> dict:
    """A live recording's state for the page: its passes and windows made final, where the open
    window starts (the page sends the audio from there), when to run the next pass, the kept
    and the partial segments, and what the pass of this step did (`ran`, `history`: None when
    it ran none)."""
    live = state["transcriber"]
    return {"recording": state["recording"], "passes": live.passes, "commits": live.commits,
            "windowStart": live.window_start, "passEnd": live.pass_end, "heard": live.heard,
            "nextPassAt": live.next_pass_at(), "passMs": state["passMs"],
            "final": [segment_payload(s) for s in live.final],
            "partial": [segment_payload(s) for s in live.partial],
            "ran": done is not None, "history": None if done is None else done.history_entry()}

def prior_segments(prior, n_vocab: int, name: str = "prior") -> list:
    """Segments from the page (segment_payload's fields) as pipelines.transcribe Segments, each
    field checked and named in the error (as `name`[i].field)."""
    from candle_web.pipelines.transcribe import Segment

    prior = python_value(prior)
    if prior is None:
        return []
    if not isinstance(prior, (list, tuple)) or len(prior) > MAX_PRIOR_SEGMENTS:
        raise FormatError(f"transcribe: {name} must be a list of at most {MAX_PRIOR_SEGMENTS} "
                          "segments")
    segments = []
    for index, item in enumerate(prior):
        where = f"transcribe: {name}[{index}]"
        if not isinstance(item, dict):
            raise FormatError(f"{where} must be a segment object, got {type(item).__name__}")

        def number(name, default=None):
            value = item.get(name, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or value != value or value in (float("inf"), float("-inf")):
                raise FormatError(f"{where}.{name} must be a finite number, got {value!r}")
            return float(value)

        start, end = number("start"), number("end")
        if not 0 <= start <= end:
            raise FormatError(f"{where}: start {start} and end {end} must satisfy 0 <= start "
                              "<= end")
        text = item.get("text")
        if not isinstance(text, str):
            raise FormatError(f"{where}.text must be a string, got {text!r}")
        tokens = item.get("tokens")
        if not isinstance(tokens, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab
                for t in tokens):
            raise FormatError(f"{where}.tokens must be a list of token ids in 0..{n_vocab - 1}")
        segments.append(Segment(id=index, seek=0, start=start, end=end, text=text,
                                tokens=list(tokens), temperature=number("temperature", 0.0),
                                avg_logprob=number("avgLogprob", 0.0), compression_ratio=0.0,
                                no_speech_prob=number("noSpeechProb", 0.0)))
    return segments


def placed_transcript(transcript, tokenizer, offset: float, prior: list):
    """The transcript of a window placed in its recording (pipelines.transcribe's)."""
    from candle_web.pipelines.transcribe import placed_transcript as placed

    return placed(transcript, tokenizer, offset, prior)


def _event_forwarder(tokenizer, on_event, offset: float = 0.0, first_id: int = 0):
    """transcribe()'s events as the page's: segments as payloads (placed at `offset` in the
    recording, numbered from `first_id`), tokens with their text."""
    if on_event is None:
        return None
    timestamp_begin = tokenizer.token_to_id("<|notimestamps|>") + 1
    eot = tokenizer.token_to_id("<|endoftext|>")

    def forward(kind, payload):
        if kind == "segment":
            message = segment_payload(payload)
            if offset or first_id:
                message.update(id=first_id + message["id"],
                               start=round(message["start"] + offset, 3),
                               end=round(message["end"] + offset, 3))
        elif kind == "token":
            token = int(payload["token"])
            text = ""
            if token < eot:  # text pieces only: no timestamps or special tokens
                text = tokenizer.decode([token], skip_special_tokens=True)
            message = {"step": int(payload["step"]), "token": token, "text": text,
                       "timestamp": token >= timestamp_begin}
        else:
            message = dict(payload)
        on_event(kind, message)

    return forward


class TimedWhisper:
    """The model seen by transcribe() and whisper_decode, timing the encoder and each decoder call.

    transcribe() and WindowDecoder use only config, device, encode, start_decoding and logits."""

    def __init__(self, model):
        self._model = model
        self.config = model.config
        self.device = model.device  # the decoders create their inputs on the model's device
        self.encode_ms = 0.0
        self.decode_ms = 0.0
        self.decoder_calls = 0

    def _timed(self, total: str, call, *args):
        """call(*args), its milliseconds added to the counter named `total`."""
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            setattr(self, total, getattr(self, total) + (time.perf_counter() - started) * 1000.0)

    def encode(self, mel):
        return self._timed("encode_ms", self._model.encode, mel)

    def start_decoding(self, audio_features):
        return self._timed("decode_ms", self._model.start_decoding, audio_features)

    def cross_attention_scores(self, tokens, audio_features):
        """Word timing's one pass (whisper_timing.py), counted with the decoder."""
        self.decoder_calls += 1
        return self._timed("decode_ms", self._model.cross_attention_scores, tokens, audio_features)

    def logits(self, tokens, state, positions=None):
        self.decoder_calls += 1
        # positions: only the rows decoding reads; the model's default when absent
        args = (tokens, state) if positions is None else (tokens, state, positions)
        return self._timed("decode_ms", self._model.logits, *args)


def segment_payload(segment) -> dict:
    return {"id": segment.id, "start": segment.start, "end": segment.end,
            "text": segment.text, "tokens": [int(t) for t in segment.tokens],
            "temperature": segment.temperature, "avgLogprob": segment.avg_logprob,
            "noSpeechProb": segment.no_speech_prob,
            **({} if segment.words is None else {"words": [
                {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                for w in segment.words]})}


def transcript_payload(transcript) -> dict:
    """The parts of a Transcript the page shows and the tests compare (also used natively)."""
    from candle_web.pipelines import subtitles

    return {"text": transcript.text, "language": transcript.language,
            "duration": transcript.duration,
            "segments": [segment_payload(s) for s in transcript.segments],
            "exports": {fmt: subtitles.render(transcript, fmt) for fmt in EXPORT_FORMATS}}


def kept_payload(kept, n_vocab: int) -> dict:
    """transcript_payload of the segments a cancelled transcription had finished ({segments,
    duration, language}, each checked as `prior` is)."""
    from candle_web.pipelines.transcribe import Transcript

    kept = python_value(kept)
    if not isinstance(kept, dict):
        raise FormatError(f"transcribe: kept must be {{segments, duration, language}}, got {kept!r}")
    segments = prior_segments(kept.get("segments"), n_vocab, "kept.segments")
    duration = kept.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) \
            or not 0 <= duration < float("inf"):
        raise FormatError(f"transcribe: kept.duration must be a number of seconds, got {duration!r}")
    language = kept.get("language")
    if language is not None and not isinstance(language, str):
        raise FormatError(f"transcribe: kept.language must be a string or null, got {language!r}")
    text = "".join(segment.text for segment in segments)
    return transcript_payload(Transcript(text=text, segments=segments, language=language,
                                         duration=float(duration)))
