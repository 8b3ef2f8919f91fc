"""Silero VAD v6 (16 kHz): the probability that each 32 ms of audio is speech, and the speech
segments those probabilities give.

Weights: `silero_vad_16k.safetensors` of the `silero-vad` 6.2.3 package (MIT). The network,
per chunk of 512 samples read with the 64 samples before it (576):

    reflect-pad 64 on the right -> 640 samples
    STFT as a convolution: 258 filters of 256 taps, stride 128 -> [258, 4]
    magnitude: sqrt(real^2 + imag^2) of the 129 bins -> [129, 4]
    conv1 129->128 k3 p1, ReLU; conv2 128->64 k3 s2 p1, ReLU -> [64, 2]
    conv3 64->64 k3 s2 p1, ReLU -> [64, 1]; conv4 64->128 k3 p1, ReLU -> [128]
    LSTM cell 128 -> 128, its state carried from chunk to chunk
    ReLU, final 1x1 conv 128 -> 1, sigmoid -> the chunk's speech probability

Everything before the LSTM depends on the chunk's own samples only, so all chunks run as one
batch through the convolutions (Tensor ops); the LSTM is the one sequential part, a small loop
over chunks in numpy (128-dim, a few microseconds a step).

`speech_timestamps` turns the probabilities into segments as the package's
`get_speech_timestamps` does (hysteresis threshold / threshold - 0.15, minimum silence,
minimum speech, padding, maximum length split at the longest silence); the option names are
faster-whisper's `VadOptions`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import FormatError, InvalidOption
from ..core.tensor import Tensor

SAMPLE_RATE = 16_000
CHUNK = 512  # samples per probability (32 ms)
CONTEXT = 64  # samples of the previous chunk read with each chunk
N_FFT, HOP = 256, 128
HIDDEN = 128
TENSORS = {  # name -> shape, as the package's safetensors file stores them
    "stft_conv.weight": (258, 1, 256),
    "conv1.weight": (128, 129, 3), "conv1.bias": (128,),
    "conv2.weight": (64, 128, 3), "conv2.bias": (64,),
    "conv3.weight": (64, 64, 3), "conv3.bias": (64,),
    "conv4.weight": (128, 64, 3), "conv4.bias": (128,),
    "lstm_cell.weight_ih": (512, 128), "lstm_cell.weight_hh": (512, 128),
    "lstm_cell.bias_ih": (512,), "lstm_cell.bias_hh": (512,),
    "final_conv.weight": (1, 128, 1), "final_conv.bias": (1,),
}


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's names and defaults (silero's own `get_speech_timestamps` defaults
    differ: min_silence_duration_ms 100, speech_pad_ms 30, min_speech_duration_ms 250)."""
    threshold: float = 0.5
    neg_threshold: float = None  # default: max(threshold - 0.15, 0.01)
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = math.inf
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400

    def __post_init__(self):
        def number(name, low, high=math.inf, integer=False):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
            if ok and integer:
                ok = float(value).is_integer()
            elif ok:
                ok = math.isfinite(value) or value == math.inf
            if not ok:
                kind = "a whole number" if integer else "a number"
                raise InvalidOption(f"vad {name} must be {kind} from {low} to {high}, got {value!r}")

        number("threshold", 0.0, 1.0)
        if self.neg_threshold is not None:
            number("neg_threshold", 0.0, 1.0)
        number("min_speech_duration_ms", 0, 3_600_000, integer=True)
        number("min_silence_duration_ms", 0, 3_600_000, integer=True)
        number("speech_pad_ms", 0, 60_000, integer=True)
        number("max_speech_duration_s", 0.1)


class SileroVad:
    def __init__(self, weights: dict):
        """weights: name -> float32 numpy array (TENSORS)."""
        for name, shape in TENSORS.items():
            if name not in weights:
                raise FormatError(f"silero vad: tensor {name} is missing")
            if tuple(weights[name].shape) != shape:
                raise FormatError(f"silero vad: tensor {name} has shape {list(weights[name].shape)}, "
                                  f"expected {list(shape)}")
        w = {name: np.ascontiguousarray(weights[name], dtype=np.float32) for name in TENSORS}
        t = {name: Tensor.from_numpy(value) for name, value in w.items()}
        self.stft = t["stft_conv.weight"]
        self.convs = [(t[f"conv{i}.weight"], t[f"conv{i}.bias"].reshape(1, -1, 1), stride)
                      for i, stride in ((1, 1), (2, 2), (3, 2), (4, 1))]
        self.w_ih, self.w_hh = w["lstm_cell.weight_ih"], w["lstm_cell.weight_hh"]
        self.b_lstm = w["lstm_cell.bias_ih"] + w["lstm_cell.bias_hh"]
        self.w_out, self.b_out = w["final_conv.weight"][0, :, 0], float(w["final_conv.bias"][0])

    @staticmethod
    def load(source) -> "SileroVad":
        """From a safetensors file path or its bytes."""
        from ..io import safetensors

        return SileroVad(safetensors.load_numpy(source))

    def features(self, samples: np.ndarray) -> np.ndarray:
        """[n_chunks, 128]: every chunk through the STFT and the four convolutions."""
        n_chunks = -(-len(samples) // CHUNK)
        padded = np.zeros(CONTEXT + n_chunks * CHUNK, dtype=np.float32)
        padded[CONTEXT:CONTEXT + len(samples)] = samples
        starts = np.arange(n_chunks)[:, None] * CHUNK
        frames = padded[starts + np.arange(CONTEXT + CHUNK)]  # [n, 576]: the context, the chunk
        frames = np.pad(frames, ((0, 0), (0, CONTEXT)), mode="reflect")  # [n, 640]
        x = Tensor.from_numpy(np.ascontiguousarray(frames[:, None, :]))
        x = x.conv1d(self.stft, stride=HOP)  # [n, 258, 4]: real parts, then imaginary parts
        bins = N_FFT // 2 + 1
        x = x.narrow(1, 0, bins).sqr().add(x.narrow(1, bins, bins).sqr()).sqrt()  # [n, 129, 4]
        for weight, bias, stride in self.convs:
            x = x.conv1d(weight, padding=1, stride=stride).broadcast_add(bias).relu()
        return x.squeeze(2).to_numpy()  # [n, 128]

    def probabilities(self, samples) -> np.ndarray:
        """Speech probability of each 512-sample chunk of 16 kHz mono float samples (the last
        chunk zero-padded)."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise InvalidOption(f"vad: expected mono samples [n], got shape {list(samples.shape)}")
        if samples.size == 0:
            return np.zeros(0, dtype=np.float32)
        gates_in = self.features(samples) @ self.w_ih.T + self.b_lstm  # [n, 512]
        h = np.zeros(HIDDEN, dtype=np.float32)
        c = np.zeros(HIDDEN, dtype=np.float32)
        hidden = np.empty((len(gates_in), HIDDEN), dtype=np.float32)
        for step, g in enumerate(gates_in):
            g = g + self.w_hh @ h  # gates in PyTorch's order: input, forget, cell, output
            i, f = _sigmoid(g[:HIDDEN]), _sigmoid(g[HIDDEN:2 * HIDDEN])
            c = f * c + i * np.tanh(g[2 * HIDDEN:3 * HIDDEN])
            h = _sigmoid(g[3 * HIDDEN:]) * np.tanh(c)
            hidden[step] = h
        return _sigmoid(np.maximum(hidden, 0.0) @ self.w_out + self.b_out).astype(np.float32)

    def speech_timestamps(self, samples, options: VadOptions = VadOptions()) -> list:
        """[{"start": sample, "end": sample}] of the speech in `samples`."""
        return speech_timestamps(self.probabilities(samples), len(samples), options)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def speech_timestamps(probs, n_samples: int, options: VadOptions = VadOptions()) -> list:
    """Speech segments (sample offsets) from per-chunk probabilities: speech starts at a chunk
    at or above `threshold` and ends after `min_silence_duration_ms` below `neg_threshold`;
    a segment over `max_speech_duration_s` is cut at its longest silence (over 98 ms), or just
    before the limit; segments shorter than `min_speech_duration_ms` are dropped; each is padded
    by `speech_pad_ms` (half the gap when two are closer than twice that)."""
    threshold = options.threshold
    neg_threshold = options.neg_threshold
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
    pad = SAMPLE_RATE * options.speech_pad_ms / 1000
    max_speech = SAMPLE_RATE * options.max_speech_duration_s - CHUNK - 2 * pad
    min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
    min_silence_at_max = SAMPLE_RATE * 98 / 1000

    speeches, current = [], {}
    triggered = False
    temp_end = prev_end = next_start = 0
    possible_ends = []  # (silence start, silence length) inside the current speech
    for i, prob in enumerate(probs):
        sample = CHUNK * i
        if prob >= threshold and temp_end:
            silence = sample - temp_end
            if silence > min_silence_at_max:
                possible_ends.append((temp_end, silence))
            temp_end = 0
            if next_start < prev_end:
                next_start = sample
        if prob >= threshold and not triggered:
            triggered = True
            current["start"] = sample
            continue
        if triggered and sample - current["start"] > max_speech:
            if possible_ends:  # cut at the longest silence so far
                prev_end, length = max(possible_ends, key=lambda e: e[1])
                current["end"] = prev_end
                speeches.append(current)
                current = {}
                next_start = prev_end + length
                if next_start < prev_end + sample:
                    current["start"] = next_start
                else:
                    triggered = False
                prev_end = next_start = temp_end = 0
                possible_ends = []
            else:  # no silence to cut at: cut here
                current["end"] = sample
                speeches.append(current)
                current = {}
                prev_end = next_start = temp_end = 0
                triggered = False
                possible_ends = []
                continue
        if prob < neg_threshold and triggered:
            if not temp_end:
                temp_end = sample
            if sample - temp_end < min_silence:
                continue
            current["end"] = temp_end
            if current["end"] - current["start"] > min_speech:
                speeches.append(current)
            current = {}
            prev_end = next_start = temp_end = 0
            triggered = False
            possible_ends = []
    if current and n_samples - current["start"] > min_speech:
        current["end"] = n_samples
        speeches.append(current)

    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - pad))
        if i != len(speeches) - 1:
            gap = speeches[i + 1]["start"] - speech["end"]
            if gap < 2 * pad:
                speech["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                speech["end"] = int(min(n_samples, speech["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            speech["end"] = int(min(n_samples, speech["end"] + pad))
    return [{"start": int(s["start"]), "end": int(s["end"])} for s in speeches]


class SpeechMap:
    """The speech segments joined into one shorter recording, and the way back: a time in the
    joined audio -> the same instant in the original recording."""

    def __init__(self, segments: list):
        self.segments = list(segments)
        self.joined_starts = []  # where each segment starts in the joined audio (samples)
        total = 0
        for s in self.segments:
            self.joined_starts.append(total)
            total += s["end"] - s["start"]
        self.joined_samples = total

    def join(self, samples: np.ndarray) -> np.ndarray:
        if not self.segments:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([samples[s["start"]:s["end"]] for s in self.segments]).astype(np.float32)

    def original_time(self, seconds: float, is_end: bool = False) -> float:
        """Seconds in the joined audio -> seconds in the recording (an end exactly on a joint
        belongs to the segment before it)."""
        sample = seconds * SAMPLE_RATE
        index = 0
        for k, start in enumerate(self.joined_starts):
            if start < sample or (start == sample and not is_end):
                index = k
        if not self.segments:
            return seconds
        return (self.segments[index]["start"] + sample - self.joined_starts[index]) / SAMPLE_RATE
