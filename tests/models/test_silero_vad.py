"""Silero VAD v6 (models/silero_vad.py) against the silero-vad package (6.2.3) and torch.

Three independent checks:
- the network: our probabilities equal a torch re-implementation of the same safetensors
  weights (F.conv1d, torch's own LSTM cell) to float32 rounding;
- the segmenting: our speech_timestamps on the *package's* probabilities equals the package's
  get_speech_timestamps exactly (same hysteresis, silence, padding and max-length rules);
- end to end: our segments against get_speech_timestamps on the package's TorchScript model, on
  real speech (the LibriVox clips) with inserted silence, within 0.1 s. The package ships its
  TorchScript model with weights that differ slightly from its safetensors file (probabilities
  differ by 0.01 on average), so boundaries can move by a chunk (32 ms) or two.
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import FormatError, InvalidOption
from candle_web.models import silero_vad
from candle_web.models.silero_vad import CHUNK, SileroVad, VadOptions, speech_timestamps

torch = pytest.importorskip("torch")
package = pytest.importorskip("silero_vad")
SILERO_DEFAULTS = dict(min_speech_duration_ms=250, min_silence_duration_ms=100, speech_pad_ms=30)
OPTION_SETS = {"faster-whisper": {}, "short-silence": dict(min_silence_duration_ms=500, speech_pad_ms=200),
               "max-speech": dict(max_speech_duration_s=4.0, min_silence_duration_ms=300, speech_pad_ms=100)}
TOLERANCE_S = 0.1


@pytest.fixture(scope="module")
def vad():
    from candle_web.pipelines import load_vad

    return load_vad()


@pytest.fixture(scope="module")
def speech_with_silence(speech_clips):
    """The LibriVox clips with 1-4 s of silence before each and 2 s at the end."""
    rng = np.random.default_rng(0)
    pieces = []
    for name in sorted(speech_clips):
        if name.startswith("librivox/"):
            pieces += [np.zeros(int(16000 * rng.uniform(1, 4)), np.float32), speech_clips[name]]
    return np.concatenate(pieces + [np.zeros(32000, np.float32)])


@pytest.fixture(scope="module")
def package_model():
    return package.load_silero_vad()


def package_probabilities(model, samples):
    model.reset_states()
    padded = np.pad(samples, (0, -len(samples) % CHUNK))
    with torch.no_grad():
        return np.array([model(torch.from_numpy(padded[i:i + CHUNK]), 16000).item()
                         for i in range(0, len(padded), CHUNK)])


def torch_probabilities(weights_path, samples):
    """The network written with torch's own ops on the same safetensors weights."""
    from safetensors.torch import load_file

    w = load_file(str(weights_path))
    F = torch.nn.functional
    padded = np.concatenate([np.zeros(64, np.float32), samples,
                             np.zeros(-len(samples) % CHUNK, np.float32)])
    cell = torch.nn.LSTMCell(128, 128)
    cell.load_state_dict({k.split(".", 1)[1]: v for k, v in w.items() if k.startswith("lstm_cell.")})
    state, out = None, []
    with torch.no_grad():
        for k in range((len(padded) - 64) // CHUNK):
            x = torch.from_numpy(padded[k * CHUNK:k * CHUNK + CHUNK + 64])[None]
            x = F.conv1d(F.pad(x, (0, 64), mode="reflect")[:, None], w["stft_conv.weight"], stride=128)
            x = (x[:, :129] ** 2 + x[:, 129:] ** 2).sqrt()
            for i, stride in ((1, 1), (2, 2), (3, 2), (4, 1)):
                x = F.relu(F.conv1d(x, w[f"conv{i}.weight"], w[f"conv{i}.bias"], stride=stride, padding=1))
            state = cell(x[..., 0], state)
            y = torch.sigmoid(F.conv1d(F.relu(state[0])[..., None], w["final_conv.weight"], w["final_conv.bias"]))
            out.append(float(y.mean()))
    return np.array(out)


def test_probabilities_equal_torch_on_the_same_weights(vad, speech_with_silence):
    from candle_web import hub

    path = hub.fetch("silero-vad", "silero_vad_16k.safetensors", offline=True)
    samples = speech_with_silence[:16000 * 12]
    ours = vad.probabilities(samples)
    theirs = torch_probabilities(path, samples)
    assert ours.shape == theirs.shape == (-(-len(samples) // CHUNK),)
    assert np.abs(ours - theirs).max() < 1e-5  # float32 conv/matmul summation order
    assert ours.max() > 0.9 and ours.min() < 0.1  # speech and silence both there


@pytest.mark.parametrize("options", [SILERO_DEFAULTS, {}, OPTION_SETS["max-speech"]],
                         ids=["silero-defaults", "faster-whisper", "max-speech"])
def test_segmenting_equals_get_speech_timestamps_on_its_probabilities(options, package_model,
                                                                      speech_with_silence):
    probs = package_probabilities(package_model, speech_with_silence)
    fw = VadOptions(**options)
    expected = package.get_speech_timestamps_from_probs(
        list(probs), threshold=fw.threshold, min_speech_duration_ms=fw.min_speech_duration_ms,
        max_speech_duration_s=fw.max_speech_duration_s, min_silence_duration_ms=fw.min_silence_duration_ms,
        speech_pad_ms=fw.speech_pad_ms, audio_length_samples=len(speech_with_silence))
    assert speech_timestamps(probs, len(speech_with_silence), fw) == expected
    assert len(expected) >= 3


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_segments_within_a_tenth_of_a_second_of_the_package(name, vad, package_model,
                                                             speech_with_silence):
    options = VadOptions(**OPTION_SETS[name])
    ours = vad.speech_timestamps(speech_with_silence, options)
    with torch.no_grad():
        theirs = package.get_speech_timestamps(
            torch.from_numpy(speech_with_silence), package_model, threshold=options.threshold,
            min_speech_duration_ms=options.min_speech_duration_ms,
            max_speech_duration_s=options.max_speech_duration_s,
            min_silence_duration_ms=options.min_silence_duration_ms, speech_pad_ms=options.speech_pad_ms)
    assert len(ours) == len(theirs) >= 3
    for a, b in zip(ours, theirs):
        assert abs(a["start"] - b["start"]) / 16000 <= TOLERANCE_S, (a, b)
        assert abs(a["end"] - b["end"]) / 16000 <= TOLERANCE_S, (a, b)


def test_speech_map_returns_to_the_recording():
    speech = silero_vad.SpeechMap([{"start": 16000, "end": 48000}, {"start": 80000, "end": 96000}])
    samples = np.arange(100000, dtype=np.float32)
    joined = speech.join(samples)
    assert len(joined) == speech.joined_samples == 48000
    assert joined[0] == 16000 and joined[32000] == 80000
    assert speech.original_time(0.0) == 1.0
    assert speech.original_time(2.0) == 5.0  # the second segment's first sample
    assert speech.original_time(2.0, is_end=True) == 3.0  # ... or the first one's end
    assert speech.original_time(2.5) == 5.5


def test_bad_options_and_weights_are_named():
    with pytest.raises(InvalidOption, match="threshold"):
        VadOptions(threshold=1.5)
    with pytest.raises(InvalidOption, match="min_silence_duration_ms"):
        VadOptions(min_silence_duration_ms=-1)
    with pytest.raises(InvalidOption, match="speech_pad_ms"):
        VadOptions(speech_pad_ms=0.5)
    with pytest.raises(FormatError, match="conv2.bias"):
        SileroVad({name: np.zeros(shape, np.float32) for name, shape in silero_vad.TENSORS.items()
                   if name != "conv2.bias"})
    with pytest.raises(FormatError, match="lstm_cell.weight_hh"):
        SileroVad({name: np.zeros((2, 2) if name == "lstm_cell.weight_hh" else shape, np.float32)
                   for name, shape in silero_vad.TENSORS.items()})


def test_vad_transcript_keeps_the_words_on_the_original_timeline(vad, whisper_models, speech_clips):
    """A recording that is half silence: with --vad only the speech is decoded (at most 60% of
    the recording reaches Whisper), the words are the same, and every segment lies in speech."""
    from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

    model, tokenizer = whisper_models("whisper-tiny.en")
    pieces, spans, cursor = [], [], 0.0
    for name in [n for n in sorted(speech_clips) if n.startswith("librivox/")][:3]:
        clip = speech_clips[name]
        gap = np.zeros(len(clip), np.float32)  # as much silence as speech
        pieces += [gap, clip]
        spans.append((cursor + len(clip) / 16000, cursor + 2 * len(clip) / 16000))
        cursor += 2 * len(clip) / 16000
    samples = np.concatenate(pieces)
    events = []
    plain = transcribe(model, tokenizer, samples, TranscribeOptions(temperatures=(0.0,)))
    filtered = transcribe(model, tokenizer, samples,
                          TranscribeOptions(temperatures=(0.0,), vad=VadOptions(), word_timestamps=True),
                          on_event=lambda kind, payload: events.append((kind, payload)),
                          vad_model=vad)
    words = lambda text: [w.strip(".,;:!?\"'").lower() for w in text.split()]  # noqa: E731
    assert words(filtered.text) == words(plain.text)
    (vad_event,) = [p for k, p in events if k == "vad"]
    streamed = [p for k, p in events if k == "segment"]  # streamed in the recording's times too
    assert [(s.start, s.end) for s in streamed] == [(s.start, s.end) for s in filtered.segments]
    assert all(p["duration"] == filtered.duration for k, p in events if k == "window")
    assert vad_event["speech_seconds"] <= 0.6 * vad_event["duration"]
    assert filtered.duration == pytest.approx(len(samples) / 16000)
    for segment in (s for s in filtered.segments if s.text):
        assert any(start - 0.5 <= segment.start and segment.end <= end + 0.5 for start, end in spans), segment
        for word in segment.words:
            assert any(start - 0.5 <= word.start <= word.end <= end + 0.5 for start, end in spans), word
    with pytest.raises(InvalidOption, match="vad_model"):
        transcribe(model, tokenizer, samples, TranscribeOptions(vad=VadOptions()))


def test_the_worker_and_batch_take_vad_options():
    """The page sends vad: true (faster-whisper's defaults) or an object of VadOptions fields;
    `batch transcribe --vad` builds the same options as `transcribe --vad`."""
    from candle_web import cli
    from candle_web.batch.command import transcribe_options
    from candle_web.core.errors import UnsupportedError
    from candle_web.worker.whisper import transcribe_options as worker_options

    assert worker_options({"vad": True}).vad == VadOptions()
    assert worker_options({"vad": {"threshold": 0.6, "speech_pad_ms": 100}}).vad == VadOptions(
        threshold=0.6, speech_pad_ms=100)
    assert worker_options({"vad": False}).vad is None
    with pytest.raises(UnsupportedError, match="pad"):
        worker_options({"vad": {"pad": 1}})
    with pytest.raises(InvalidOption, match="threshold"):
        worker_options({"vad": {"threshold": 2}})
    parser = cli.build_parser()
    args = parser.parse_args(["batch", "transcribe", "x.wav", "--out", "o", "--vad",
                              "--vad-min-silence-duration-ms", "500", "--word-timestamps"])
    options = transcribe_options(args)
    assert options.vad == VadOptions(min_silence_duration_ms=500) and options.word_timestamps
    with pytest.raises(InvalidOption, match="--highlight-words"):
        transcribe_options(parser.parse_args(["batch", "transcribe", "x.wav", "--out", "o",
                                              "--highlight-words"]))
