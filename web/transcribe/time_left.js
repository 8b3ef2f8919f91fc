// Time left of a transcription, from its measured speed. Whisper's cost is per 30 s window
// (the encoder reads a whole padded window; the decoder writes up to ~450 tokens), not per
// second of audio: a 0.64 s tail window costs about what a full one does. So once a window
// has ended the estimate is the windows still to come, each at the mean time a window took,
// plus what remains of the current one; before that, the seconds of audio done so far set
// the pace. A current window that runs past the mean with none after it is said to be
// finishing rather than "about 1 s left" for as long as it takes.

import { WINDOW_SECONDS } from "./format.js";

export class WindowClock {
  constructor() {
    this.current = null; // {start (audio seconds), at (ms)}
    this.firstAt = null;
    this.durations = []; // ms each ended window took
    this.advances = []; // audio seconds each ended window moved on
  }

  // A window starting at `start` seconds of the audio, at time `now` (ms).
  window(start, now) {
    this.firstAt ??= now;
    if (this.current !== null && start > this.current.start) {
      this.durations.push(now - this.current.at);
      this.advances.push(start - this.current.start);
    }
    this.current = { start, at: now };
  }

  // {seconds, finishing}: the seconds left (null: not known yet), and whether only the last
  // window remains and it has already taken longer than a window takes on average.
  left(now, reached, total) {
    if (this.durations.length === 0) {
      if (this.firstAt === null || reached <= 0 || reached >= total) return { seconds: null, finishing: false };
      return { seconds: ((now - this.firstAt) / 1000 / reached) * (total - reached), finishing: false };
    }
    const mean = (values) => values.reduce((sum, value) => sum + value, 0) / values.length;
    const windowMs = mean(this.durations);
    const advance = Math.min(Math.max(mean(this.advances), 1), WINDOW_SECONDS);
    const after = Math.max(0, Math.ceil((total - (this.current.start + advance)) / advance));
    const currentMs = Math.max(windowMs - (now - this.current.at), 0);
    return { seconds: (after * windowMs + currentMs) / 1000, finishing: after === 0 && currentMs === 0 };
  }
}
