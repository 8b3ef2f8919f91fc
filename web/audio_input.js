// Audio into the Transcribe view: any format the browser decodes, as 16 kHz mono float32
// samples (files, sample clips and microphone recordings all take this one path), and those
// samples back out as a WAV the <audio> player can seek in.

export const SAMPLE_RATE = 16000;

export class AudioInputError extends Error {
  constructor(message) {
    super(message);
    this.name = "AudioInputError";
  }
}

// Any format the browser decodes, resampled to 16 kHz by decoding through a 16 kHz context;
// several channels are averaged to mono (as ffmpeg's -ac 1 does).
export async function decodeToMono16k(arrayBuffer, name) {
  if (arrayBuffer.byteLength === 0) {
    throw new AudioInputError(`${name} is empty (0 bytes): choose an audio file.`);
  }
  const context = new OfflineAudioContext(1, 1, SAMPLE_RATE);
  let decoded;
  try {
    decoded = await context.decodeAudioData(arrayBuffer);
  } catch (error) {
    throw new AudioInputError(`${name} could not be decoded as audio (${error.message || error.name}). Choose a WAV, MP3, OGG, FLAC or M4A file.`);
  }
  if (decoded.length === 0) {
    throw new AudioInputError(`${name} holds no audio samples.`);
  }
  if (decoded.numberOfChannels === 1) {
    return decoded.getChannelData(0);
  }
  const mono = new Float32Array(decoded.length);
  for (let channel = 0; channel < decoded.numberOfChannels; channel += 1) {
    const data = decoded.getChannelData(channel);
    for (let i = 0; i < data.length; i += 1) mono[i] += data[i];
  }
  const scale = 1 / decoded.numberOfChannels;
  for (let i = 0; i < mono.length; i += 1) mono[i] *= scale;
  return mono;
}

// 16-bit PCM mono WAV of float samples in [-1, 1]: a recording's playback copy (a MediaRecorder
// WebM has no duration or cues, so a player cannot seek in it).
export function encodeWav(samples, sampleRate = SAMPLE_RATE) {
  const dataBytes = samples.length * 2;
  const buffer = new ArrayBuffer(44 + dataBytes);
  const view = new DataView(buffer);
  const ascii = (offset, text) => {
    for (let i = 0; i < text.length; i += 1) view.setUint8(offset + i, text.charCodeAt(i));
  };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * 2, true); // bytes per second
  view.setUint16(32, 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  for (let i = 0; i < samples.length; i += 1) {
    const value = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(44 + 2 * i, value < 0 ? value * 0x8000 : value * 0x7fff, true);
  }
  return new Blob([buffer], { type: "audio/wav" });
}
