"""Language and task in the Transcribe view, with the multilingual whisper-base (in the
default model set, served from the sha256-checked cache like tiny.en): a Spanish sentence
synthesised by espeak-ng is detected as Spanish (language and probability shown) and
transcribed, then, with Spanish picked and Translate chosen, comes out in English. The
references are the sentence itself and its meaning: the words of each must be there."""
from __future__ import annotations

import pytest
from tests.ui.transcribe_testlib import (MODEL_TINY, choose_model, run_to_end, run_tool, screenshot,
                                         tool, view_state, wait_idle_with_clip, words,
                                         words_found_in_order)

pytestmark = pytest.mark.ui

MODEL_BASE = "whisper-base"
SPANISH = "Buenos días. Hoy hace muy buen tiempo y vamos juntos al parque."
# Its meaning in English: "Good morning. Today the weather is very good and we are going to
# the park together." Whisper's wording may differ; these words carry the meaning.
ENGLISH_WORDS = {"good", "morning", "today", "park"}
SPANISH_ONLY_WORDS = {"buenos", "días", "hoy", "tiempo", "vamos", "parque"}


@pytest.fixture(scope="module")
def spanish_clip(tmp_path_factory):
    """The sentence spoken by espeak-ng's Spanish voice, as a 16 kHz mono WAV (sox)."""
    espeak, sox = tool("espeak-ng"), tool("sox")
    folder = tmp_path_factory.mktemp("spanish")
    raw = folder / "espeak.wav"
    run_tool(espeak, "-v", "es", "-s", "150", "-w", str(raw), SPANISH)
    clip = folder / "buenos_dias.wav"
    run_tool(sox, str(raw), "-r", "16000", "-c", "1", "-b", "16", str(clip))
    return clip


@pytest.fixture
def restore_form(ready_page):
    """Leave the view as the other tests expect it: tiny.en, detect, transcribe."""
    yield
    page = ready_page
    choose_model(page, MODEL_TINY)  # hides the language and task controls: reset them directly
    page.evaluate("""() => { document.getElementById('language-select').value = '';
                             document.getElementById('task-transcribe').checked = true; }""")


def test_an_english_only_model_says_language_and_task_do_not_apply(ready_page, restore_form):
    page = ready_page
    choose_model(page, MODEL_TINY)
    assert page.locator("#language-select").is_disabled()
    assert page.locator("#task-translate").is_disabled()
    assert "English-only" in page.locator("#language-note").inner_text()
    choose_model(page, MODEL_BASE)
    assert page.locator("#language-select").is_enabled()
    assert page.locator("#language-select").input_value() == ""  # detect by default
    assert page.locator("#task-transcribe").is_checked()
    # Whisper's languages by name, the code alongside.
    assert page.locator("#language-select option[value=es]").inner_text() == "Spanish (es)"
    # The advanced options start at the command line's defaults: greedy, timestamps on.
    assert page.locator("#beam-size").input_value() == ""
    assert page.locator("#timestamps").is_checked()


def test_spanish_is_detected_and_transcribed_then_translated(ready_page, spanish_clip, report,
                                                             restore_form):
    page = ready_page
    choose_model(page, MODEL_BASE)
    page.set_input_files("#file-input", str(spanish_clip))
    wait_idle_with_clip(page, spanish_clip.name)

    state = run_to_end(page)
    result = state["result"]
    assert result["model"] == MODEL_BASE and result["options"]["task"] == "transcribe"
    assert "language" not in result["options"]  # detection
    assert result["language"] == "es" and result["detected"]["language"] == "es"
    probability = result["detected"]["probability"]
    assert page.locator("#stat-language").inner_text() == \
        f"Spanish (es), detected {probability * 100:.0f}%"
    expected = words(SPANISH)
    assert words_found_in_order(expected, words(result["text"])) >= 0.8 * len(expected), \
        result["text"]
    load = view_state(page, "s.lastLoad")
    screenshot(page, "transcribe-language-detected")

    page.select_option("#language-select", "es")
    page.check("#task-translate")
    state = run_to_end(page)
    translated = state["result"]
    assert translated["options"] == {"language": "es", "task": "translate"}
    assert translated["detected"] is None  # picked, so not detected
    got = set(words(translated["text"]))
    assert ENGLISH_WORDS <= got, translated["text"]
    assert not (SPANISH_ONLY_WORDS & got), translated["text"]
    assert page.locator("#stat-language").inner_text() == "Spanish (es) → English"
    shown = page.locator("#segments .segment-text").all_inner_texts()
    assert words(" ".join(shown)) == words(translated["text"])
    report(f"[ui] whisper-base: loaded in {sum(load['timingsMs'].values()) / 1000:.1f} s "
           f"({load['downloadedBytes'] / 1e6:.0f} MB downloaded); detected es "
           f"{probability:.2f}: {result['text'].strip()!r} in "
           f"{result['timings']['elapsedMs'] / 1000:.1f} s; translated "
           f"{translated['text'].strip()!r} in {translated['timings']['elapsedMs'] / 1000:.1f} s")
