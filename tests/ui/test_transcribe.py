"""The Transcribe view end to end in headless Chromium, and the Whisper twin check.

Real inputs only: the LibriVox clips of Debian's pocketsphinx-testdata (vendored into
web/vendor/samples/ from the cache by scripts/vendor_samples.py) and the real whisper-tiny.en
CTranslate2 files, served by `candle-web serve` and downloaded by the worker into the Cache API.

The five LibriVox clips are transcribed once each, through different doors: a synthesised
DataTransfer drop, the file picker (set_input_files), a sample button with a cancel mid-way and
a second run, and sample buttons. The results are kept in BROWSER_RUNS; the twin check then
compares every clip's token ids with a native run of the same model on the numpy backend
(tests/ui/native_whisper.py in a subprocess started when this module starts, so it runs on the
other core while the browser works). Greedy decoding picks argmax logits: the browser's sgemm
and native numpy's BLAS sum in different orders, so logits differ in the last bits, but the ids
must be equal -- a near-tie flip would be a real finding, not a tolerance question.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.ui.transcribe_testlib import (ARTIFACTS_DIR, SAMPLES_DIR, TRANSCRIBE_TIMEOUT_MS,
                                         assert_matches_reference, run_to_end, run_tool,
                                         samples_manifest, tool, view_state, wait_idle_with_clip)

NATIVE_SCRIPT = Path(__file__).with_name("native_whisper.py")
MODEL = "whisper-tiny.en"
CLIP_DROP = "sense_and_sensibility_01_austen_64kb-0880.wav"
CLIP_PICKER = "sense_and_sensibility_01_austen_64kb-0930.wav"
CLIP_CANCEL = "sense_and_sensibility_01_austen_64kb-0870.wav"
# Transcribed by the export test itself (a clip no earlier test runs, so in file order the twin
# check reuses that run instead of repeating it).
CLIP_EXPORT = "sense_and_sensibility_01_austen_64kb-0890.wav"
# A transcription of a few seconds of audio takes tens of seconds in Pyodide on a busy
# 2-core machine (the encoder is ~35 GFLOP per 30 s window); allow a generous margin.
CANCEL_TIMEOUT_MS = 60_000
NATIVE_TIMEOUT_S = 600
SRT_TIME = r"(\d\d):(\d\d):(\d\d),(\d\d\d)"
VIEWS = ["transcribe", "generate", "text2text", "similarity"]

pytestmark = pytest.mark.ui

# clip file name -> the page's state.lastResult for it (filled by the tests, in file order).
BROWSER_RUNS: dict[str, dict] = {}


def librivox_clips() -> list[dict]:
    clips = [clip for clip in samples_manifest() if clip["librivox"]]
    assert len(clips) == 5, [clip["file"] for clip in clips]
    return clips


# --- native twin, started early ----------------------------------------------------------------

class NativeRun:
    """tests/ui/native_whisper.py on the five clips, in a subprocess using one BLAS thread."""

    def __init__(self, clip_files: list[str]):
        environment = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1",
                           OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        # --chromium-pcm: the int16 -> float conversion Chromium's decoder uses (see there).
        command = [sys.executable, str(NATIVE_SCRIPT), "--chromium-pcm", MODEL] + \
            [str(SAMPLES_DIR / name) for name in clip_files]
        self.process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self._result = None

    def result(self) -> dict:
        if self._result is None:
            stdout, stderr = self.process.communicate(timeout=NATIVE_TIMEOUT_S)
            if self.process.returncode != 0:
                pytest.fail(f"native twin failed (exit {self.process.returncode}):\n{stderr}",
                            pytrace=False)
            self._result = json.loads(stdout)
        return self._result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture(scope="module", autouse=True)
def native_twin(model_file):
    for name in ("model.bin", "config.json", "tokenizer.json"):
        model_file(MODEL, name)  # fail early, with the fetch hint, when the cache lacks it
    run = NativeRun([clip["file"] for clip in librivox_clips()])
    yield run
    run.stop()


# --- page helpers ----------------------------------------------------------------------------------

def wait_for_clip(page, name: str) -> None:
    page.wait_for_function(
        "(name) => { const s = window.candleWeb.transcribe;"
        " return s.clip !== null && s.clip.name === name && s.runtimeReady && !s.busy; }",
        arg=name)
    assert page.locator("#transcribe-button").is_enabled()


def choose_sample(page, file_name: str) -> str:
    button = page.locator(f"button.sample[data-file='{file_name}']")
    button.click()
    title = next(c["title"] for c in samples_manifest() if c["file"] == file_name)
    wait_for_clip(page, title)
    return title


def drop_file(page, name: str, data: bytes, mime: str) -> None:
    """A real drop as the browser would deliver it: dragenter, dragover, drop with a
    DataTransfer holding a File built from the given bytes."""
    page.evaluate("""([name, b64, mime]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], name, {type: mime}));
        const zone = document.getElementById('drop-zone');
        for (const type of ['dragenter', 'dragover', 'drop']) {
            zone.dispatchEvent(new DragEvent(type, {dataTransfer: transfer, bubbles: true,
                                                    cancelable: true}));
        }
    }""", [name, base64.b64encode(data).decode("ascii"), mime])


def record_run(file_name: str, state: dict, report) -> dict:
    result = state["result"]
    BROWSER_RUNS[file_name] = result
    timings = result["timings"]
    report(f"[ui] {file_name[-8:]}: {timings['audioSeconds']:.2f} s audio in "
           f"{timings['elapsedMs'] / 1000:.1f} s (RTF {timings['rtf']:.2f}; encoder "
           f"{timings['encodeMs'] / 1000:.1f} s, decoder {timings['decodeMs'] / 1000:.1f} s "
           f"over {timings['decoderCalls']} calls): {result['text'].strip()!r}")
    return result


def displayed_segments(page) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('#segments .segment')].map(
        (li) => ({start: Number(li.dataset.start), end: Number(li.dataset.end),
                  time: li.querySelector('.segment-time').textContent,
                  text: li.querySelector('.segment-text').textContent}))""")


# --- the view ---------------------------------------------------------------------------------------

def test_view_controls_are_labelled_and_reachable_by_keyboard(ready_page):
    page = ready_page
    zone = page.locator("#drop-zone")
    # A labelled group holding the Choose button (a role=button zone may not hold controls).
    assert zone.get_attribute("role") == "group"
    assert page.locator("#drop-title").inner_text() == "Drop audio files here"
    choose = page.locator("#choose-files")
    for selector in ("#file-input", "#clip-player", "#job-progress"):
        assert page.locator(selector).get_attribute("aria-label"), selector
    assert page.locator("label[for=model-select]").inner_text() == "Model"
    assert page.locator("#job-phase").get_attribute("aria-live") == "polite"
    assert page.locator("#transcribe-error").get_attribute("role") == "alert"
    # Sizes come from the registry through the worker's `models` command.
    from candle_web import hub

    registry = hub.default_registry()
    page.wait_for_function("() => document.querySelector('#model-select option').dataset.size")
    options = page.evaluate("() => [...document.querySelectorAll('#model-select option')]"
                            ".map((o) => ({value: o.value, size: Number(o.dataset.size),"
                            " text: o.textContent}))")
    assert [o["value"] for o in options] == ["whisper-tiny.en", "whisper-base"]
    for option in options:
        assert option["size"] == registry[option["value"]].size
        decimals = 0 if option["size"] >= 1e8 else 1  # the page's formatBytes
        assert f"{option['size'] / 1e6:.{decimals}f} MB" in option["text"]
    # Keyboard: focus the Choose button, Enter opens the file chooser; the clip is current.
    choose.focus()
    with page.expect_file_chooser() as chooser:
        # Waiting for the chooser turns Playwright's file-chooser interception on, in a message
        # it does not wait for; on a loaded machine the key press could reach the browser before
        # it and the chooser would open and close unseen (a 30 s timeout). This round trip to the
        # page is answered only after the interception is in place, and checks that the
        # keyboard focus is still on the zone when Enter is pressed.
        assert page.evaluate("() => document.activeElement.id") == "choose-files"
        page.keyboard.press("Enter")
    chooser.value.set_files(str(SAMPLES_DIR / "goforward.wav"))
    wait_for_clip(page, "goforward.wav")
    assert page.locator("#clip-player").get_attribute("src").startswith("blob:")
    page.keyboard.press("Tab")  # the controls after the zone are plain, focusable buttons
    assert page.evaluate("() => document.activeElement.tagName") == "BUTTON"


def test_non_audio_and_empty_files_get_an_inline_error(ready_page):
    page = ready_page
    error = page.locator("#transcribe-error")
    drop_file(page, "notes.txt", b"this is a text file, not audio\n" * 20, "text/plain")
    error.wait_for(state="visible")
    assert "notes.txt could not be decoded as audio" in error.inner_text()
    page.set_input_files("#file-input", files=[{"name": "empty.wav", "mimeType": "audio/wav",
                                                 "buffer": b""}])
    page.wait_for_function("() => document.getElementById('transcribe-error')"
                           ".textContent.includes('empty.wav is empty')")
    # The page stays usable: a real clip clears the message and can be transcribed.
    choose_sample(page, "goforward.wav")
    assert error.is_hidden()
    assert page.locator("#transcribe-button").is_enabled()
    assert page.page_log.errors == []


def test_dropped_wav_loads_the_model_and_streams_the_transcript(ready_page, report):
    page = ready_page
    drop_file(page, CLIP_DROP, (SAMPLES_DIR / CLIP_DROP).read_bytes(), "audio/wav")
    wait_for_clip(page, CLIP_DROP)
    state = run_to_end(page)
    result = record_run(CLIP_DROP, state, report)

    # The first load of the session downloads every byte (and says so).
    from candle_web import hub

    load = state["load"]
    assert load["key"] == MODEL and load["cached"] is False
    assert load["downloadedBytes"] == hub.default_registry()[MODEL].size
    download_events = [e for e in state["events"] if e["phase"] == "download" and e.get("file")]
    assert {e["file"] for e in download_events} == {"model.bin", "config.json", "tokenizer.json"}
    assert all(e["cached"] is False for e in download_events)

    # Streamed while running: window, token and segment events before the final result.
    assert state["streamed"]["windows"] == 1
    assert state["streamed"]["tokens"] >= sum(len(s["tokens"]) for s in result["segments"])
    assert state["streamed"]["segments"] == len(result["segments"])
    assert_matches_reference(CLIP_DROP, result["text"])
    shown = displayed_segments(page)
    assert [s["text"] for s in shown] == [s["text"].strip() for s in result["segments"]
                                          if s["text"].strip()]
    assert shown[0]["time"].startswith("0:00.00 → ")
    # The speed in words that say which way it went (processing time / audio length).
    rtf = result["timings"]["rtf"]
    assert page.locator("#stat-rtf").inner_text() == (
        "about real time" if abs(rtf - 1) < 0.05
        else f"{1 / rtf:.1f}× faster than real time" if rtf < 1
        else f"{rtf:.1f}× slower than real time")
    assert result["timings"]["rtf"] == pytest.approx(
        result["timings"]["elapsedMs"] / 1000 / result["timings"]["audioSeconds"])


def test_file_picker_transcribes_with_the_loaded_model(ready_page, report):
    page = ready_page
    page.set_input_files("#file-input", str(SAMPLES_DIR / CLIP_PICKER))
    wait_for_clip(page, CLIP_PICKER)
    state = run_to_end(page)
    result = record_run(CLIP_PICKER, state, report)
    assert state["events"] == []  # the model stayed loaded: no load this time
    assert_matches_reference(CLIP_PICKER, result["text"])


@pytest.fixture(scope="module")
def repeated_clip(tmp_path_factory):
    """CLIP_CANCEL twelve times over (~85 s: three windows). The wasm backend transcribes the
    clip alone in about a second, which a click can miss; three windows leave time to cancel
    mid-way."""
    out = tmp_path_factory.mktemp("cancel") / "cancel_me.wav"
    run_tool(tool("sox"), str(SAMPLES_DIR / CLIP_CANCEL), str(out), "repeat", "11")
    return out


def test_cancel_mid_way_then_transcribe_again(ready_page, repeated_clip, report):
    page = ready_page
    page.set_input_files("#file-input", str(repeated_clip))
    wait_idle_with_clip(page, repeated_clip.name)
    page.click("#transcribe-button")
    # Mid-way: the worker has finished the first window and is busy with the next.
    page.wait_for_function("() => window.candleWeb.transcribe.streamed.windows > 0",
                           timeout=CANCEL_TIMEOUT_MS)
    page.click("#cancel-button")
    page.wait_for_function("() => !window.candleWeb.transcribe.busy", timeout=CANCEL_TIMEOUT_MS)
    assert view_state(page, "s.lastError") == {"name": "Cancelled",
                                               "message": "cancelled by the page"}
    assert page.locator("#job").get_attribute("data-state") == "cancelled"
    assert page.locator("#transcribe-error").is_hidden()  # a cancel is not an error
    # The worker stays usable: the clip itself, to the end.
    choose_sample(page, CLIP_CANCEL)
    state = run_to_end(page)
    result = record_run(CLIP_CANCEL, state, report)
    assert_matches_reference(CLIP_CANCEL, result["text"])


def parse_srt(text: str) -> list[dict]:
    cues = []
    for block in [b for b in text.strip().split("\n\n") if b.strip()]:
        lines = block.split("\n")
        match = re.fullmatch(SRT_TIME + " --> " + SRT_TIME, lines[1])
        assert match, lines[1]
        h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(g) for g in match.groups())
        cues.append({"index": int(lines[0]),
                     "start": h1 * 3600 + m1 * 60 + s1 + ms1 / 1000,
                     "end": h2 * 3600 + m2 * 60 + s2 + ms2 / 1000,
                     "text": " ".join(lines[2:])})
    return cues


def download(page, selector: str) -> tuple[str, str]:
    with page.expect_download() as pending:
        page.click(selector)
    item = pending.value
    return item.suggested_filename, Path(item.path()).read_text(encoding="utf-8")


def test_export_srt_vtt_txt_json_and_copy(ready_page, report):
    page = ready_page
    choose_sample(page, CLIP_EXPORT)
    result = record_run(CLIP_EXPORT, run_to_end(page), report)
    assert_matches_reference(CLIP_EXPORT, result["text"])
    cues_expected = [s for s in result["segments"] if s["text"].strip()]

    name, srt = download(page, "#download-srt")
    assert name.endswith(".srt")
    cues = parse_srt(srt)
    assert [c["index"] for c in cues] == list(range(1, len(cues_expected) + 1))
    for cue, segment in zip(cues, cues_expected, strict=True):
        assert cue["start"] == pytest.approx(segment["start"], abs=1e-3)
        assert cue["end"] == pytest.approx(segment["end"], abs=1e-3)
        assert cue["text"] == segment["text"].strip()

    name, vtt = download(page, "#download-vtt")
    assert name.endswith(".vtt") and vtt.startswith("WEBVTT\n")
    assert vtt.count(" --> ") == len(cues_expected)
    name, txt = download(page, "#download-txt")
    assert txt.split("\n")[:len(cues_expected)] == [s["text"].strip() for s in cues_expected]
    name, json_text = download(page, "#download-json")
    exported = json.loads(json_text)
    assert exported["text"] == result["text"]
    assert [s["tokens"] for s in exported["segments"]] == [s["tokens"] for s in result["segments"]]

    page.click("#copy-button")
    page.wait_for_function("() => document.getElementById('copy-status').textContent !== ''")
    assert page.locator("#copy-status").inner_text() == "Copied."


def test_twin_browser_token_ids_equal_native_numpy(ready_page, native_twin, report):
    """For the five LibriVox clips: same input samples, same token ids in every segment."""
    page = ready_page
    for clip in librivox_clips():
        if clip["file"] not in BROWSER_RUNS:  # not done by a test above (e.g. run alone)
            choose_sample(page, clip["file"])
            record_run(clip["file"], run_to_end(page), report)
    native = native_twin.result()
    assert native["backend"] == "numpy"
    lines = []
    for clip in librivox_clips():
        name = clip["file"]
        browser, twin = BROWSER_RUNS[name], native["clips"][name]
        assert browser["input"]["sha256"] == twin["sha256"], f"{name}: decoded samples differ"
        browser_ids = [s["tokens"] for s in browser["segments"]]
        native_ids = [s["tokens"] for s in twin["segments"]]
        assert browser_ids == native_ids, name
        assert browser["text"] == twin["text"]
        assert sum(len(ids) for ids in browser_ids) > 5  # a real transcript, not an empty one
        lines.append(f"{name[-8:-4]}: {sum(map(len, browser_ids))} ids equal; browser "
                     f"{browser['timings']['elapsedMs'] / 1000:.1f} s, native numpy "
                     f"{twin['seconds']:.1f} s")
    report("[ui] twin check (whisper-tiny.en, browser vs native numpy backend): "
           + "; ".join(lines))


def test_second_visit_loads_the_model_from_the_cache(fresh_page, network_guard, report):
    """A new page (a second visit in the same browser profile) finds the model files in the
    Cache API: progress says cached, and not one request goes to /models/."""
    page = fresh_page
    mark = network_guard.allowed_mark()
    page.wait_for_function("() => window.candleWeb && window.candleWeb.transcribe.runtimeReady",
                           timeout=TRANSCRIBE_TIMEOUT_MS)
    reply = page.evaluate("""async (model) => {
        const events = [];
        const reply = await window.candleWeb.client.request('load', {model},
            {onProgress: (m) => events.push({phase: m.phase, state: m.state, file: m.file,
                                             cached: m.cached})});
        return {reply, events};
    }""", MODEL)
    load, events = reply["reply"], reply["events"]
    assert load["cached"] is True and load["downloadedBytes"] == 0
    file_events = [e for e in events if e["phase"] == "download" and e["file"]]
    assert {e["file"] for e in file_events} == {"model.bin", "config.json", "tokenizer.json"}
    assert all(e["cached"] is True for e in file_events)
    assert any(e["phase"] == "verify" for e in events)  # hashes re-checked on cached bytes
    # Only the Whisper files count: the Text-to-text view asks once at start-up whether the
    # demo T5 folder (models/local/...) is served, which is not a model download.
    model_requests = [u for u in network_guard.allowed_since(mark) if f"/models/{MODEL}/" in u]
    assert model_requests == []
    report(f"[ui] second visit: model from the Cache API in "
           f"{load['timingsMs']['download'] / 1000:.2f} s, built in "
           f"{load['timingsMs']['build'] / 1000:.2f} s, no request for its files")


def test_screenshot_of_every_view(ready_page):
    page = ready_page
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    for view in VIEWS:
        page.click(f"#tab-{view}")
        assert page.locator(f"#panel-{view}").is_visible()
        page.screenshot(path=str(ARTIFACTS_DIR / f"view-{view}.png"), full_page=True)
    page.click("#tab-transcribe")
    assert page.locator("#panel-transcribe").is_visible()
