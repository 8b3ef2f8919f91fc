"""No lost drops in the Transcribe view: a file dropped while the Python runtime is still
starting is kept and transcribed as soon as the runtime is up, without a press (the button
says so meanwhile); three files dropped at once while that first one loads its model or
transcribes queue behind it and are transcribed in turn, each with its own transcript and its
own export. The references are the clips' LibriVox / pocketsphinx transcripts."""
from __future__ import annotations

from pathlib import Path

import pytest
from tests.ui.transcribe_testlib import (TRANSCRIBE_TIMEOUT_MS, assert_matches_reference,
                                         drop_files, items, sample_file, screenshot, view_state)

pytestmark = pytest.mark.ui

CLIP_EARLY = "sense_and_sensibility_01_austen_64kb-0880.wav"
QUEUE = ("sense_and_sensibility_01_austen_64kb-0930.wav",
         "sense_and_sensibility_01_austen_64kb-0890.wav",
         "goforward.wav")
START_TIMEOUT_MS = 240_000  # the runtime's cold start on a busy machine, then the model


def button_text(page) -> str:
    return page.locator("#transcribe-button").inner_text()


def test_a_drop_while_loading_is_kept_then_three_dropped_files_queue(fresh_page, report):
    page = fresh_page
    page.wait_for_function("() => window.candleWeb !== undefined")
    drop_files(page, [sample_file(CLIP_EARLY)])
    page.wait_for_function("() => window.candleWeb.transcribe.items.length === 1 &&"
                           " window.candleWeb.transcribe.items[0].status !== 'decoding'")
    early = view_state(page, "({ready: s.runtimeReady, status: s.items[0].status})")
    # Dropped before the runtime was up (it takes seconds; decoding a WAV, milliseconds).
    assert early == {"ready": False, "status": "queued"}
    assert button_text(page) == "Queued: transcribes when ready"
    assert page.locator("#transcribe-button").is_disabled()
    screenshot(page, "transcribe-queue-dropped-while-starting")

    # No press: it starts once the runtime is up. Three more arrive in one drop meanwhile.
    page.wait_for_function("() => window.candleWeb.transcribe.busy", timeout=START_TIMEOUT_MS)
    job_state = page.locator("#job").get_attribute("data-state")
    drop_files(page, [sample_file(name) for name in QUEUE])
    page.wait_for_function("() => window.candleWeb.transcribe.items.filter("
                           "(i) => i.status === 'queued').length === 3 ||"
                           " !window.candleWeb.transcribe.busy")
    at_drop = view_state(page, "({busy: s.busy, statuses: s.items.map((i) => i.status)})")
    assert at_drop["busy"] and at_drop["statuses"] == ["running", "queued", "queued", "queued"]
    assert button_text(page) == "3 queued: next when this one is done"
    screenshot(page, "transcribe-queue-three-queued")

    page.wait_for_function("() => window.candleWeb.transcribe.items.every("
                           "(i) => i.status === 'done' || i.status === 'error')",
                           timeout=(1 + len(QUEUE)) * TRANSCRIBE_TIMEOUT_MS)
    entries = items(page)
    assert [e["name"] for e in entries] == [CLIP_EARLY, *QUEUE]
    assert [e["status"] for e in entries] == ["done"] * 4
    assert view_state(page, "s.runs") == 4  # each once, in the order dropped, never pressed

    # Each has its own transcript and export: pick it in the list, read it, download it.
    for index, entry in enumerate(entries):
        page.locator("#clip-queue .queue-select").nth(index).click()
        assert view_state(page, "s.clip.name") == entry["name"]
        shown = page.locator("#segments .segment-text").all_inner_texts()
        assert shown == [s["text"].strip() for s in entry["segments"]]
        assert_matches_reference(entry["name"], entry["text"])
        with page.expect_download() as pending:
            page.click("#download-txt")
        download = pending.value
        assert download.suggested_filename == f"{Path(entry['name']).stem}.txt"
        assert Path(download.path()).read_text(encoding="utf-8").splitlines() == shown
    screenshot(page, "transcribe-queue-done")
    report(f"[ui] queue: first file dropped while the runtime started, three more while the "
           f"view was {job_state!r}; all four transcribed in order without a press")
