"""Transcription as a task: long-form transcription of a recording, a run placed in a longer
recording, and live transcription.

Long-form (`transcribe`, openai-whisper's algorithm): the log-mel spectrogram of the whole
recording is read in 30 s windows; each window is decoded (models/whisper_decode.py's
`WindowDecoder`) at the first of `temperatures` whose result is neither too repetitive
(compression ratio) nor too unlikely (average log-probability), unless it is silence; the
window's tokens are cut into segments at consecutive timestamp pairs and the next window starts
where the last complete segment ended (with word timestamps: where the last word ended); the
text so far prompts the next window (condition_on_previous_text) until a window needs a
temperature above 0.5. With VAD, only the speech is transcribed and every time is mapped back
onto the recording.

Live: the policy the Transcribe view's live mode follows (it lived in the page's JavaScript
before, where only a browser could test it):

* a pass runs over the *open window* of the recording: from `window_start` up to what has been
  heard, at most one Whisper window (30 s, one encoder pass);
* the next pass runs once LIVE_STEP_SECONDS more have been heard since the last one ended (at
  once when passes fall behind the speaker);
* a window that has reached LIVE_WINDOW_SECONDS is *final*: its segments but the last are kept,
  and the next window starts where that last one began (it may end in a word the window's end
  cut in two), or at the window's end when there is only one segment;
* each pass is prompted with the end (PROMPT_CHARACTERS) of the kept text, so the next window
  continues its wording;
* after Stop, one last pass over what is left returns the transcript of the whole recording,
  the kept segments first.

`LiveTranscriber` holds that state; the browser worker (candle_web.worker.whisper) drives one
per recording, and tests drive it natively on recorded speech.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..core.errors import Cancelled, CandleError, FormatError, InvalidOption
from ..core.tensor import Tensor
from ..generation import option_limits as limits
from ..io import audio as audio_mod
from ..models import whisper_timing
from ..models.silero_vad import SpeechMap, VadOptions
from ..models.whisper_decode import (INPUT_STRIDE, TASKS, TIME_PRECISION, DecodingOptions,
                                     DecodingResult, WhisperTokenizer, WindowDecoder,
                                     check_decoder_rows, detect_language)

SAMPLE_RATE = 16_000
WINDOW_SECONDS = 30  # one Whisper window: a longer open window would cost a second encoder pass
LIVE_STEP_SECONDS = 3.0
LIVE_WINDOW_SECONDS = 12.0
PROMPT_CHARACTERS = 200
MIN_PASS_SECONDS = 0.5  # a pass over less new audio than this is not worth the encoder
# The kept segments' start must be this far into the window for the last one to be redone: a
# window that is one long segment is kept whole instead of starting again at its own start.
REDO_MIN_START_SECONDS = 1.0


# -- long-form transcription ---------------------------------------------------------------
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # the fallback's, in order


@dataclass(frozen=True)
class TranscribeOptions:
    language: str = None
    task: str = "transcribe"
    temperatures: tuple = DEFAULT_TEMPERATURES
    beam_size: int = None
    best_of: int = 5
    patience: float = None
    compression_ratio_threshold: float = 2.4
    logprob_threshold: float = -1.0
    no_speech_threshold: float = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str = None
    without_timestamps: bool = False
    suppress_tokens: object = "-1"
    word_timestamps: bool = False  # per-word start, end and probability (whisper_timing.py)
    prepend_punctuations: str = whisper_timing.PREPEND_PUNCTUATIONS
    append_punctuations: str = whisper_timing.APPEND_PUNCTUATIONS
    vad: VadOptions = None  # transcribe only the speech Silero VAD finds (needs vad_model)

    def __post_init__(self):
        """Range checks at construction (CLI, browser worker and Python callers alike), so a
        bad value fails before the audio is decoded and names the option and its range."""
        limits.BEAM_SIZE.check(self.beam_size, "beam_size", optional=True)
        limits.BEST_OF.check(self.best_of, "best_of", optional=True)
        limits.PATIENCE.check(self.patience, "patience", optional=True)
        if not isinstance(self.temperatures, (tuple, list)) or not self.temperatures:
            raise InvalidOption(f"temperatures must be a non-empty list of numbers >= 0, got "
                                f"{self.temperatures!r}")
        for temperature in self.temperatures:
            limits.TEMPERATURE.check(temperature, "temperatures entry")
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            limits.THRESHOLD.check(getattr(self, name), name, optional=True)
        if self.task not in TASKS:
            raise InvalidOption(f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.word_timestamps and self.without_timestamps:
            raise InvalidOption("word_timestamps needs the timestamp tokens: it cannot be "
                                "combined with without_timestamps")
        if self.vad is not None and not isinstance(self.vad, VadOptions):
            raise InvalidOption(f"vad must be a silero_vad.VadOptions or None, got {self.vad!r}")
        for name in ("prepend_punctuations", "append_punctuations"):
            if not isinstance(getattr(self, name), str):
                raise InvalidOption(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("language", "initial_prompt"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise InvalidOption(f"{name} must be a string, got {getattr(self, name)!r}")


@dataclass
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list = None  # whisper_timing.Word per word, with word_timestamps


@dataclass
class Transcript:
    text: str
    segments: list
    language: str
    duration: float
    windows: list = field(default_factory=list)  # DecodingResult of each decoded window


def transcribe(model, tokenizer, samples, options: TranscribeOptions = TranscribeOptions(),
               on_event=None, should_continue=None, vad_model=None) -> Transcript:
    """Transcribe float32 16 kHz mono samples of any length. With `options.vad`, only the
    speech `vad_model` (a silero_vad.SileroVad: pipelines.load_vad()) finds is decoded, joined
    into one shorter recording; the times stay on the original timeline."""
    samples = np.asarray(samples, dtype=np.float32)
    if options.vad is not None:
        return _transcribe_speech(model, tokenizer, samples, options, on_event, should_continue,
                                  vad_model)
    # Before any work: a beam width whose decoder state cannot fit fails now, not mid-way.
    check_decoder_rows(model.config, options.beam_size or 1, "beam_size")
    check_decoder_rows(model.config, options.best_of or 1, "best_of")
    if samples.ndim != 1:
        raise CandleError(f"transcribe: expected mono samples [n], got shape {list(samples.shape)}")
    n_mels = model.config.n_mels
    mel = audio_mod.log_mel_spectrogram(samples, n_mels=n_mels, padding=audio_mod.N_SAMPLES)
    content_frames = mel.shape[-1] - audio_mod.N_FRAMES
    duration = len(samples) / audio_mod.SAMPLE_RATE
    multilingual = model.config.is_multilingual
    tk = WhisperTokenizer(tokenizer, multilingual, None, options.task)
    language = options.language
    if multilingual and language is None:
        first = Tensor.from_numpy(audio_mod.pad_or_trim(mel, audio_mod.N_FRAMES)[None], device=model.device)
        probs = detect_language(model, tk, model.encode(first))
        language = max(probs, key=probs.get)
        _emit(on_event, "language", {"language": language, "probability": probs[language]})
    tk = WhisperTokenizer(tokenizer, multilingual, language if multilingual else None, options.task)

    seek = 0
    all_tokens = []
    all_segments = []
    windows = []
    prompt_reset_since = 0
    last_speech_timestamp = 0.0
    if options.initial_prompt:
        all_tokens.extend(tk.encode(" " + options.initial_prompt.strip()))
    while seek < content_frames:
        if should_continue is not None and not should_continue():
            raise Cancelled("transcription cancelled")
        time_offset = seek * audio_mod.HOP_LENGTH / audio_mod.SAMPLE_RATE
        segment_size = min(audio_mod.N_FRAMES, content_frames - seek)
        segment_duration = segment_size * audio_mod.HOP_LENGTH / audio_mod.SAMPLE_RATE
        window = audio_mod.pad_or_trim(mel[:, seek:seek + segment_size], audio_mod.N_FRAMES)
        _emit(on_event, "window", {"seek_seconds": time_offset, "duration": duration})
        features = model.encode(Tensor.from_numpy(np.ascontiguousarray(window)[None], device=model.device))
        prompt = all_tokens[prompt_reset_since:]
        result = _decode_with_fallback(model, tk, features, options, prompt, on_event)
        windows.append(result)
        if options.no_speech_threshold is not None:
            skip = result.no_speech_prob > options.no_speech_threshold
            if options.logprob_threshold is not None and result.avg_logprob > options.logprob_threshold:
                skip = False
            if skip:
                seek += segment_size
                continue
        current, seek = _split_segments(tk, result, seek, segment_size, segment_duration, time_offset)
        if options.word_timestamps:
            whisper_timing.add_word_timestamps(
                current, model, tk, features, segment_size, last_speech_timestamp, tk.language,
                options.prepend_punctuations, options.append_punctuations)
            ts = [t >= tk.timestamp_begin for t in result.tokens[-2:]]
            single_timestamp_ending = ts == [False, True]
            word_end = whisper_timing.last_word_end(current)
            if not single_timestamp_ending and word_end is not None and word_end > time_offset:
                seek = round(word_end * audio_mod.SAMPLE_RATE / audio_mod.HOP_LENGTH)
            if word_end is not None:
                last_speech_timestamp = word_end
        for segment in current:
            if segment.start == segment.end or not segment.text.strip():
                segment.text = ""
                segment.tokens = []
                if segment.words is not None:
                    segment.words = []
        for segment in current:
            segment.id = len(all_segments)
            all_segments.append(segment)
            _emit(on_event, "segment", segment)
        all_tokens.extend(t for s in current for t in s.tokens)
        if not options.condition_on_previous_text or result.temperature > 0.5:
            prompt_reset_since = len(all_tokens)
    text = tk.decode([t for s in all_segments for t in s.tokens])
    return Transcript(text=text, segments=all_segments, language=language or "en",
                      duration=duration, windows=windows)


def _transcribe_speech(model, tokenizer, samples, options, on_event, should_continue, vad_model):
    """transcribe() over the speech only: the VAD's segments joined, transcribed, and every
    segment and word time mapped back onto the recording (as faster-whisper's vad_filter)."""
    from dataclasses import replace

    if vad_model is None:
        raise InvalidOption("vad: options.vad needs a vad_model (pipelines.load_vad())")
    if samples.ndim != 1:
        raise CandleError(f"transcribe: expected mono samples [n], got shape {list(samples.shape)}")
    speech = SpeechMap(vad_model.speech_timestamps(samples, options.vad))
    _emit(on_event, "vad", {"segments": [dict(s) for s in speech.segments],
                            "speech_seconds": speech.joined_samples / audio_mod.SAMPLE_RATE,
                            "duration": len(samples) / audio_mod.SAMPLE_RATE})
    inner = replace(options, vad=None)
    duration = len(samples) / audio_mod.SAMPLE_RATE
    if not speech.segments:
        multilingual = model.config.is_multilingual
        language = options.language or "en"
        return Transcript(text="", segments=[], language=language if multilingual else "en",
                          duration=duration)

    def placed(segment):  # a segment of the joined speech, on the recording's timeline
        words = segment.words
        if words:
            words = [replace(w, start=round(speech.original_time(w.start), 3),
                             end=round(speech.original_time(w.end, is_end=True), 3)) for w in words]
        return replace(segment, start=round(speech.original_time(segment.start), 3),
                       end=round(speech.original_time(segment.end, is_end=True), 3), words=words)

    def forward(kind, payload):  # progress and streamed segments in the recording's times too
        if kind == "window":
            payload = dict(payload, seek_seconds=round(speech.original_time(payload["seek_seconds"]), 3),
                           duration=duration)
        elif kind == "segment":
            payload = placed(payload)
        return on_event(kind, payload)

    result = transcribe(model, tokenizer, speech.join(samples), inner,
                        forward if on_event is not None else None, should_continue)
    result.segments = [placed(segment) for segment in result.segments]
    result.duration = duration
    return result


def _emit(on_event, kind, payload):
    if on_event is not None and on_event(kind, payload) is False:
        raise Cancelled(f"cancelled at {kind}")


def _decode_with_fallback(model, tk, features, options: TranscribeOptions, prompt, on_event):
    result = None
    for temperature in options.temperatures:
        decoding = DecodingOptions(
            task=options.task, language=tk.language, temperature=temperature,
            beam_size=options.beam_size if temperature == 0 else None,
            patience=options.patience if temperature == 0 else None,
            best_of=options.best_of if temperature > 0 else None,
            prompt=prompt, without_timestamps=options.without_timestamps,
            suppress_tokens=options.suppress_tokens)
        result = WindowDecoder(model, tk, decoding, on_event).run(features)
        needs_fallback = False
        if options.compression_ratio_threshold is not None and \
                result.compression_ratio > options.compression_ratio_threshold:
            needs_fallback = True  # too repetitive
        if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
            needs_fallback = True  # too unlikely
        if options.no_speech_threshold is not None and result.no_speech_prob > options.no_speech_threshold \
                and options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
            needs_fallback = False  # silence: no point retrying
        if not needs_fallback:
            break
    return result


def _split_segments(tk, result: DecodingResult, seek, segment_size, segment_duration, time_offset):
    """Cut a window's tokens at consecutive timestamp pairs; returns (segments, next seek)."""
    tokens = np.array(result.tokens, dtype=np.int64)
    is_ts = tokens >= tk.timestamp_begin
    single_timestamp_ending = len(is_ts) >= 2 and not is_ts[-2] and is_ts[-1]
    consecutive = np.nonzero(is_ts[:-1] & is_ts[1:])[0] + 1
    segments = []

    def segment(start, end, seg_tokens):
        seg_tokens = [int(t) for t in seg_tokens]
        return Segment(id=0, seek=seek, start=round(start, 3), end=round(end, 3),
                       text=tk.decode(seg_tokens), tokens=seg_tokens,
                       temperature=result.temperature, avg_logprob=result.avg_logprob,
                       compression_ratio=result.compression_ratio, no_speech_prob=result.no_speech_prob)

    if len(consecutive) > 0:
        slices = consecutive.tolist()
        if single_timestamp_ending:
            slices.append(len(tokens))
        last_slice = 0
        for current_slice in slices:
            sliced = tokens[last_slice:current_slice]
            start_pos = int(sliced[0]) - tk.timestamp_begin
            end_pos = int(sliced[-1]) - tk.timestamp_begin
            segments.append(segment(time_offset + start_pos * TIME_PRECISION,
                                    time_offset + end_pos * TIME_PRECISION, sliced))
            last_slice = current_slice
        if single_timestamp_ending:
            seek += segment_size
        else:
            last_pos = int(tokens[last_slice - 1]) - tk.timestamp_begin
            seek += last_pos * INPUT_STRIDE
    else:
        length = segment_duration
        stamps = tokens[is_ts]
        if len(stamps) > 0 and int(stamps[-1]) != tk.timestamp_begin:
            length = (int(stamps[-1]) - tk.timestamp_begin) * TIME_PRECISION
        segments.append(segment(time_offset, time_offset + length, tokens))
        seek += segment_size
    return segments, seek


# -- a run placed in a recording, live transcription --------------------------------------
def placed_transcript(transcript, tokenizer, offset: float, prior: list):
    """The transcript of a run placed in its recording: its segments moved by `offset` seconds
    (rounded to the millisecond) and numbered after the `prior` segments, which come first; the
    text of them all; the duration up to the run's end."""
    moved = [replace(s, id=len(prior) + i, start=round(s.start + offset, 3),
                     end=round(s.end + offset, 3), words=_moved_words(s.words, offset))
             for i, s in enumerate(transcript.segments)]
    segments = list(prior) + moved
    eot = tokenizer.token_to_id("<|endoftext|>")
    text = tokenizer.decode([t for s in segments for t in s.tokens if t < eot],
                            skip_special_tokens=True)
    return Transcript(text=text, segments=segments, language=transcript.language,
                      duration=offset + transcript.duration, windows=transcript.windows)


def _moved_words(words, offset: float):
    if words is None:
        return None
    return [replace(w, start=round(w.start + offset, 3), end=round(w.end + offset, 3)) for w in words]


def options_from_args(args):
    """TranscribeOptions from the `transcribe` command's arguments (the CLI and `batch
    transcribe` share them). The temperatures are openai-whisper's: `--temperature` then up by
    `--temperature-increment-on-fallback` to 1.0 (`--no-fallback`: `--temperature` only)."""
    start, step = args.temperature, args.temperature_increment_on_fallback
    if step and step < 0.01:
        raise InvalidOption(f"temperature_increment_on_fallback must be 0, none or at least 0.01 "
                            f"(at most 100 retries a window), got {step}")
    if args.no_fallback or not step:
        temperatures = (start,)
    else:
        temperatures = tuple(round(float(t), 6) for t in np.arange(start, 1.0 + 1e-6, step)) or (start,)
    return TranscribeOptions(
        language=args.language, task=args.task, beam_size=args.beam_size,
        temperatures=temperatures, initial_prompt=args.initial_prompt,
        without_timestamps=args.without_timestamps, word_timestamps=args.word_timestamps,
        prepend_punctuations=args.prepend_punctuations, append_punctuations=args.append_punctuations,
        condition_on_previous_text=args.condition_on_previous_text,
        compression_ratio_threshold=args.compression_ratio_threshold,
        logprob_threshold=args.logprob_threshold, no_speech_threshold=args.no_speech_threshold,
        vad=vad_options_from_args(args))


def vad_options_from_args(args):
    """silero_vad.VadOptions from `--vad` and its `--vad-*` options, None without `--vad`."""
    if not args.vad:
        return None
    return VadOptions(threshold=args.vad_threshold,
                      min_speech_duration_ms=args.vad_min_speech_duration_ms,
                      min_silence_duration_ms=args.vad_min_silence_duration_ms,
                      speech_pad_ms=args.vad_speech_pad_ms,
                      max_speech_duration_s=args.vad_max_speech_duration_s)


def transcribe_placed(model, tokenizer, samples, options=None, offset: float = 0.0,
                      prior=(), on_event=None):
    """transcribe over `samples`, placed at `offset` seconds of a recording
    after the `prior` segments (see placed_transcript; unchanged when both are empty)."""
    transcript = transcribe(model, tokenizer, samples, options or TranscribeOptions(),
                            on_event=on_event)
    if offset or prior:
        transcript = placed_transcript(transcript, tokenizer, offset, list(prior))
    return transcript


@dataclass
class LivePass:
    """What one pass did: its number, how much had been heard, the end of the window it read,
    whether the window became final, and the kept and the partial segments after it (recording
    time); `transcript`: the pass's own transcript (placed)."""
    number: int
    heard: float
    window_end: float
    committed: bool
    final: list
    partial: list
    transcript: object = None

    def history_entry(self) -> dict:
        """The page's record of the pass (texts only)."""
        return {"pass": self.number, "heard": self.heard, "windowEnd": self.window_end,
                "final": [s.text for s in self.final], "partial": [s.text for s in self.partial]}


@dataclass
class LiveTranscriber:
    """The live policy over one recording (see the module doc). `model`, `tokenizer`: what
    transcribe takes; `options`: TranscribeOptions (initial_prompt is replaced
    by the kept text's end on every pass)."""
    model: object
    tokenizer: object
    options: object = None
    window_start: float = 0.0  # seconds: where the open window starts in the recording
    pass_end: float = 0.0  # seconds: the end of the window the last pass read
    heard: float = 0.0  # seconds of recording seen so far
    passes: int = 0
    commits: int = 0
    final: list = field(default_factory=list)  # kept segments, recording time
    partial: list = field(default_factory=list)  # the last pass's segments of the open window

    def next_pass_at(self) -> float:
        """Seconds of recording to wait for before the next pass."""
        return self.pass_end + LIVE_STEP_SECONDS

    def _window(self, samples, start: float):
        """The open window out of `samples` (the recording from `start` seconds on): the part
        from window_start, at most one Whisper window long."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise FormatError(f"live: expected mono samples [n], got shape {list(samples.shape)}")
        skip = int(round((self.window_start - start) * SAMPLE_RATE))
        if skip < 0:
            raise FormatError(f"live: the samples start at {start:.3f} s, after the open window "
                              f"(from {self.window_start:.3f} s)")
        self.heard = max(self.heard, start + samples.size / SAMPLE_RATE)
        return samples[skip:skip + WINDOW_SECONDS * SAMPLE_RATE]

    def _options(self):
        options = self.options or TranscribeOptions()
        text = "".join(s.text for s in self.final).strip()
        if not text:
            return options
        return replace(options, initial_prompt=text[-PROMPT_CHARACTERS:])

    def step(self, samples, start: float = 0.0, on_event=None) -> LivePass | None:
        """One pass over the open window; `samples`: the recording heard so far from `start`
        seconds on (start <= window_start). None when less than MIN_PASS_SECONDS is there."""
        window = self._window(samples, start)
        if window.size < MIN_PASS_SECONDS * SAMPLE_RATE:
            return None
        window_end = self.window_start + window.size / SAMPLE_RATE
        transcript = transcribe_placed(self.model, self.tokenizer, window, self._options(),
                                       offset=self.window_start, on_event=on_event)
        self.passes += 1
        self.pass_end = window_end
        segments = [s for s in transcript.segments if s.text.strip()]
        committed = window_end - self.window_start >= LIVE_WINDOW_SECONDS
        if committed:
            last = segments[-1] if segments else None
            redo = len(segments) >= 2 and last.start > self.window_start + REDO_MIN_START_SECONDS
            self.final.extend(segments[:-1] if redo else segments)
            self.partial = [last] if redo else []
            self.window_start = last.start if redo else window_end
            self.commits += 1
        else:
            self.partial = segments
        return LivePass(number=self.passes, heard=self.heard, window_end=window_end,
                        committed=committed, final=list(self.final), partial=list(self.partial),
                        transcript=transcript)

    def finish(self, samples, start: float = 0.0, on_event=None):
        """After Stop: the last pass over all that is left of the recording (`samples` from
        `start` seconds on, to its end; longer than a window when passes fell behind, then
        transcribe seeks through it), and the transcript of the whole recording: the kept
        segments, then that pass's."""
        self._window(samples, start)  # checks the samples and counts them as heard
        samples = np.asarray(samples, dtype=np.float32)
        skip = int(round((self.window_start - start) * SAMPLE_RATE))
        begin = min(skip, max(samples.size - 1, 0))  # at least the last sample
        offset = self.window_start if begin == skip else start + begin / SAMPLE_RATE
        self.passes += 1
        self.partial = []
        kept = [replace(s, id=i) for i, s in enumerate(self.final)]  # numbered in the recording
        return transcribe_placed(self.model, self.tokenizer, samples[begin:], self._options(),
                                 offset=offset, prior=kept, on_event=on_event)
