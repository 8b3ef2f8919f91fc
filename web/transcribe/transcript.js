// The Transcribe view's transcript: the segments (final and partial), the stats and the
// exports of the entry shown, the player that follows the segments, and the progress line of
// a running transcription, all rendered from what the worker sends.

import { formatBytes, formatSeconds } from "../view_common.js";
import { WindowClock } from "./time_left.js";
import {
  EXPORT_FORMATS, EXPORT_TYPES, WINDOW_SECONDS, describeSpeed, fileBase, formatAmount, formatClock, formatLeft, languageName,
} from "./format.js";

function segmentElement(segment, partial) {
  const row = document.createElement("li");
  row.className = partial ? "segment partial" : "segment";
  row.dataset.start = String(segment.start);
  row.dataset.end = String(segment.end);
  const time = document.createElement("button");
  time.type = "button";
  time.className = "segment-time";
  time.textContent = `${formatClock(segment.start)} → ${formatClock(segment.end)}`;
  time.setAttribute("aria-label", `Play from ${formatClock(segment.start)}`);
  const text = document.createElement("span");
  text.className = "segment-text";
  if (Array.isArray(segment.words) && segment.words.length > 0) {
    // The space before a word stays outside its highlight.
    text.append(...segment.words.flatMap((word, index) => {
      const space = index > 0 && /^\s/.test(word.word) ? [" "] : [];
      return [...space, wordElement(word)];
    }));
  } else {
    text.textContent = segment.text.trim();
  }
  row.append(time, text);
  return row;
}

// One word of a segment with word timestamps: highlighted while it plays, a click (or Enter,
// once the arrow keys brought the focus there) plays from it.
function wordElement(word) {
  const span = document.createElement("span");
  span.className = "word";
  span.setAttribute("role", "button");
  span.tabIndex = -1; // the transcript's words are one tab stop (rovingWords)
  span.dataset.start = String(word.start);
  span.dataset.end = String(word.end);
  span.textContent = word.word.trim();
  span.title = `${formatClock(word.start)} → ${formatClock(word.end)}, p ${word.probability.toFixed(2)}`;
  return span;
}

function describeLanguage(item) {
  const language = item.result?.language;
  if (!language || item.result.multilingual === false) return null;
  const name = `${languageName(language)} (${language})`;
  if (item.detected && item.detected.language === language) {
    return `${name}, detected ${(item.detected.probability * 100).toFixed(0)}%`;
  }
  return item.result.task === "translate" ? `${name} → English` : name;
}

export class TranscriptView {
  constructor({ ui, state, $ }) {
    this.ui = ui;
    this.state = state;
    this.$ = $;
    this.exportUrls = [];
    this.following = false; // the player was started or sought: highlight its segment
    this.#followPlayer();
  }

  renderSegments(item) {
    const rows = item.segments.filter((s) => s.text.trim()).map((s) => segmentElement(s, false));
    rows.push(...item.partial.filter((s) => s.text.trim()).map((s) => segmentElement(s, true)));
    if (rows.length === 0 && item.status === "done") {
      // Whisper heard nothing it would write down: said, rather than an empty list.
      const empty = document.createElement("li");
      empty.className = "segment-empty note";
      empty.textContent = "No speech heard in this recording.";
      rows.push(empty);
    }
    this.ui.segments.replaceChildren(...rows);
    this.rovingWords();
    this.highlightPlaying();
  }

  // The words are one tab stop, as a composite widget's items are (WAI-ARIA's roving
  // tabindex): the focused word (else the first) takes it; the arrow keys move between words.
  rovingWords() {
    const words = this.ui.segments.querySelectorAll("span.word");
    if (words.length > 0 && !this.ui.segments.querySelector("span.word[tabindex='0']")) words[0].tabIndex = 0;
  }

  // The whole transcript of an entry: its segments, and its stats and exports once done.
  render(item) {
    const { ui } = this;
    this.renderSegments(item);
    ui.liveText.textContent = "";
    ui.copyStatus.textContent = "";
    this.clearExports();
    if (item.result) {
      this.showResult(item);
    } else {
      ui.stats.hidden = true;
      ui.exports.hidden = true;
    }
  }

  append(item, segment) {
    item.segments.push(segment);
    if (this.state.clip === item && segment.text.trim()) {
      this.ui.segments.append(segmentElement(segment, false));
      this.rovingWords();
      this.highlightPlaying();
    }
  }

  clearExports() {
    for (const url of this.exportUrls) URL.revokeObjectURL(url);
    this.exportUrls = [];
  }

  showResult(item) {
    const { $ } = this;
    const { result } = item;
    const { timings } = result;
    // A cancelled transcription's kept segments (result.partial) have exports but no timings.
    this.ui.stats.hidden = !timings;
    if (timings) this.showStats(item);
    this.clearExports();
    const heard = result.segments.some((segment) => segment.text.trim());
    this.ui.exports.hidden = !heard; // nothing to export when no speech was heard
    if (!heard) return;
    const base = result.partial ? `${fileBase(item.name)}-partial` : fileBase(item.name);
    const what = result.partial ? `the ${result.segments.length} kept segments of ${item.name}` : `the transcript of ${item.name}`;
    for (const format of EXPORT_FORMATS) {
      const link = $(`download-${format}`);
      const url = URL.createObjectURL(new Blob([result.exports[format]], { type: EXPORT_TYPES[format] }));
      this.exportUrls.push(url);
      link.href = url;
      link.download = `${base}.${format}`;
      link.setAttribute("aria-label", `Download ${what} as ${format.toUpperCase()}`);
    }
  }

  showStats(item) {
    const { $ } = this;
    const { result } = item;
    const { timings } = result;
    $("stat-elapsed").textContent = formatSeconds(timings.elapsedMs / 1000);
    $("stat-audio").textContent = formatSeconds(timings.audioSeconds);
    $("stat-rtf").textContent = describeSpeed(timings.rtf);
    $("stat-rtf").title = timings.rtf === null ? "" : `processing time ÷ audio duration: ${timings.rtf.toFixed(2)}`;
    const language = describeLanguage(item);
    $("stat-language-box").hidden = language === null;
    $("stat-language").textContent = language || "";
    $("stat-memory").textContent = result.heap ? formatBytes(result.heap.endBytes) : "–";
    $("stat-memory").title = "the memory of this tab's Python worker (its WebAssembly heap) when the transcription ended";
  }

  // Highlights the segment at the player's position once the audio has been played or sought
  // (a player that was never started points at no line).
  highlightPlaying() {
    const { ui, state } = this;
    const time = ui.player.currentTime;
    const playable = this.following && state.clip !== null && state.clip.url !== null && ui.player.src !== "";
    let current = null;
    for (const word of ui.segments.querySelectorAll("span.word.playing")) {
      word.classList.remove("playing");
    }
    for (const row of ui.segments.children) {
      const inside = playable && !row.classList.contains("partial")
        && Number(row.dataset.start) <= time && time < Number(row.dataset.end);
      row.classList.toggle("playing", inside);
      if (inside) {
        row.setAttribute("aria-current", "true");
        current = row;
        const word = [...row.querySelectorAll("span.word")].findLast(
          (span) => Number(span.dataset.start) <= time && time < Number(span.dataset.end));
        if (word) word.classList.add("playing");
      } else {
        row.removeAttribute("aria-current");
      }
    }
    state.playingSegment = current === null ? null : [...ui.segments.children].indexOf(current);
  }

  // Audio you can follow: click a segment to play from it; the playing one is highlighted.
  #followPlayer() {
    const { ui, state } = this;
    const playFrom = (target) => {
      const row = target.closest("li.segment");
      if (!row || row.classList.contains("partial") || !state.clip?.url) return;
      this.following = true;
      const word = target.closest("span.word");
      ui.player.currentTime = Number((word ?? row).dataset.start);
      this.highlightPlaying();
      ui.player.play().catch(() => {}); // a browser may refuse to start sound; the seek stands
    };
    ui.segments.addEventListener("click", (event) => playFrom(event.target));
    ui.segments.addEventListener("keydown", (event) => {
      const word = event.target.closest?.("span.word");
      if (!word) return;
      const words = [...ui.segments.querySelectorAll("span.word")];
      const index = words.indexOf(word);
      const moves = { ArrowRight: index + 1, ArrowDown: index + 1, ArrowLeft: index - 1, ArrowUp: index - 1, Home: 0, End: words.length - 1 };
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        playFrom(word);
      } else if (event.key in moves) {
        event.preventDefault();
        const next = words[Math.min(Math.max(moves[event.key], 0), words.length - 1)];
        word.tabIndex = -1;
        next.tabIndex = 0;
        next.focus();
      }
    });
    for (const type of ["play", "seeking"]) {
      ui.player.addEventListener(type, () => { this.following = true; });
    }
    ui.player.addEventListener("emptied", () => { this.following = false; });
    for (const type of ["timeupdate", "seeked", "play", "pause", "emptied"]) {
      ui.player.addEventListener(type, () => this.highlightPlaying());
    }
  }
}

// Counts a progress message in the view's state: the streamed events and the worker's heap.
function countProgress(state, message) {
  if (typeof message.heapBytes === "number" && state.heap !== null) {
    state.heap.lastBytes = message.heapBytes;
    if (message.event === "window") {
      if (state.heap.firstWindowBytes === null) state.heap.firstWindowBytes = message.heapBytes;
      state.heap.windows.push(message.heapBytes); // at each window's start
    }
  }
  if (message.event === "window") state.streamed.windows += 1;
  if (message.event === "token") state.streamed.tokens += 1;
  if (message.event === "segment") state.streamed.segments += 1;
}

// The progress handler of one transcription: "2.5 of 10.0 min · about 6 min left", then what
// the current window is doing; tokens appear as they come, segments join the transcript.
// `offset` places the samples in a longer recording (a live pass).
export function transcribeProgress({ ui, state, transcript }, item, totalSeconds, offset = 0) {
  let reached = 0;
  let tokens = 0;
  let windowText = "";
  const clock = new WindowClock();
  state.progress = { doneSeconds: 0, totalSeconds, leftSeconds: null };
  const shown = () => state.clip === item;
  const line = (what) => {
    let left = "";
    const { seconds, finishing } = clock.left(performance.now(), reached, totalSeconds);
    if (seconds !== null) {
      state.progress.leftSeconds = seconds;
      left = finishing ? " · finishing the last window" : ` · ${formatLeft(seconds)}`;
    }
    state.progress.doneSeconds = reached;
    ui.phase.textContent = `${formatAmount(reached, totalSeconds)} transcribed${left} — ${windowText}: ${what}`;
    ui.progress.value = totalSeconds > 0 ? Math.min(reached / totalSeconds, 1) : 0;
  };
  const events = {
    language: (data) => {
      item.detected = { language: data.language, probability: data.probability };
      ui.phase.textContent = `Detected language: ${languageName(data.language)} (${data.language}, ${(data.probability * 100).toFixed(0)}%)`;
    },
    window: (data) => {
      const start = data.seek_seconds;
      clock.window(start, performance.now());
      reached = Math.max(reached, start);
      const end = Math.min(start + WINDOW_SECONDS, totalSeconds);
      windowText = `window ${formatClock(offset + start)}–${formatClock(offset + end)}`;
      tokens = 0;
      if (shown()) ui.liveText.textContent = "";
      line("encoding the audio…");
    },
    token: (data) => {
      tokens += 1;
      if (shown()) {
        if (data.step === 0) ui.liveText.textContent = ""; // a new (or retried) window
        ui.liveText.textContent += data.text;
      }
      line(`decoding, ${tokens} tokens`);
    },
    segment: (data) => {
      if (item.status !== "live") transcript.append(item, data);
      reached = Math.max(reached, data.end - offset);
      if (shown()) ui.liveText.textContent = "";
      line(`decoding, ${tokens} tokens`);
    },
  };
  return (message) => {
    if (message.phase !== "transcribe") return;
    countProgress(state, message);
    events[message.event]?.(message.data);
  };
}
