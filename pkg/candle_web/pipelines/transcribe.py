"""Transcription as a task: a run placed in a longer recording, and live transcription.

Long audio is transcribed by seeking through 30 s windows in `models.whisper_decode.transcribe`;
this module adds what a recording that is still going on needs, the policy the Transcribe
view's live mode follows (it lived in the page's JavaScript before, where only a browser could
test it):

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

from ..core.errors import FormatError

SAMPLE_RATE = 16_000
WINDOW_SECONDS = 30  # one Whisper window: a longer open window would cost a second encoder pass
LIVE_STEP_SECONDS = 3.0
LIVE_WINDOW_SECONDS = 12.0
PROMPT_CHARACTERS = 200
MIN_PASS_SECONDS = 0.5  # a pass over less new audio than this is not worth the encoder
# The kept segments' start must be this far into the window for the last one to be redone: a
# window that is one long segment is kept whole instead of starting again at its own start.
REDO_MIN_START_SECONDS = 1.0


def placed_transcript(transcript, tokenizer, offset: float, prior: list):
    """The transcript of a run placed in its recording: its segments moved by `offset` seconds
    (rounded to the millisecond) and numbered after the `prior` segments, which come first; the
    text of them all; the duration up to the run's end."""
    from ..models.whisper_decode import Transcript

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
    from ..models.whisper_decode import TranscribeOptions

    from ..core.errors import InvalidOption

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
    from ..models.silero_vad import VadOptions

    if not args.vad:
        return None
    return VadOptions(threshold=args.vad_threshold,
                      min_speech_duration_ms=args.vad_min_speech_duration_ms,
                      min_silence_duration_ms=args.vad_min_silence_duration_ms,
                      speech_pad_ms=args.vad_speech_pad_ms,
                      max_speech_duration_s=args.vad_max_speech_duration_s)


def transcribe_placed(model, tokenizer, samples, options=None, offset: float = 0.0,
                      prior=(), on_event=None):
    """whisper_decode.transcribe over `samples`, placed at `offset` seconds of a recording
    after the `prior` segments (see placed_transcript; unchanged when both are empty)."""
    from ..models.whisper_decode import TranscribeOptions, transcribe

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
    whisper_decode.transcribe takes; `options`: TranscribeOptions (initial_prompt is replaced
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
        from ..models.whisper_decode import TranscribeOptions

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
