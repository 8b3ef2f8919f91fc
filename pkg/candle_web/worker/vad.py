"""Silero VAD for the Transcribe view's "Skip silence" option: the page loads it (`load` with
kind "vad", model "silero-vad") beside Whisper, and the Whisper session's transcribe runs it
when the options ask for `vad` (see whisper.transcribe_options). It has no run command of its
own."""
from __future__ import annotations

from candle_web.core.errors import UnsupportedError
from candle_web.worker.session import Session

WEIGHTS_FILE = "silero_vad_16k.safetensors"
DEFAULT_MODEL = "silero-vad"


class VadSession(Session):
    kind = "vad"
    command = "transcribe"  # the command that uses it (named in error messages)
    required_files = (WEIGHTS_FILE,)

    def build(self, files: dict):
        from candle_web.models.silero_vad import SileroVad

        return SileroVad.load(files[WEIGHTS_FILE])

    def describe(self, model) -> dict:
        return {"sampleRate": 16_000, "chunkSamples": 512}

    def compute(self, model, on_event=None, **request) -> dict:
        raise UnsupportedError("vad: no run command of its own; transcribe with options.vad")

    def current(self):
        """The loaded VAD model (the one `load` built)."""
        return self.loaded(DEFAULT_MODEL) if DEFAULT_MODEL in self._loaded else \
            self.loaded(next(iter(self._loaded), DEFAULT_MODEL))
