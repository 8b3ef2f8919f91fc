"""The Similarity view end to end in headless Chromium, and the BERT embedding twin check.

Real inputs only: the registry's all-MiniLM-L6-v2 files (safetensors, config, tokenizer.json)
served by `candle-web serve` and downloaded by the worker into the Cache API.

The twin check compares the browser's sentence vectors, transferred as float32 bits, with a
native run of the same session code (candle_web.worker.bert, numpy backend) on the same
sentences, in a subprocess started when the module starts. Tolerance 1e-5 per component: the
vectors are L2-normalised (components ~0.05); the browser's matmuls are scipy's sgemm for
wasm32 and native ones numpy's OpenBLAS, which add the same f32 products in different orders,
so the hidden states differ by ~1e-7 relative after six layers (measured: printed); a wrong
kernel, mask or pooling is off by 1e-3 or more.
"""
from __future__ import annotations

import base64

import numpy as np
import pytest
from tests.ui.text_views_testlib import (NativeTextJobs, leave_page_as_found, open_view,
                                         run_and_wait, view_state)

MODEL = "all-minilm-l6-v2"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "A woman is playing the violin.",
]
# A real paragraph, repeated past the 256-token limit (sentence-transformers' max_seq_length).
LONG_SENTENCE = " ".join(["The quick brown fox jumps over the lazy dog near the riverbank, "
                          "while the children watch from the old stone bridge."] * 12)
MAX_TOKENS = 256
EMBED_TIMEOUT_MS = 300_000
TWIN_ATOL = 1e-5

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page):
    yield from leave_page_as_found(ready_page)


@pytest.fixture(scope="module", autouse=True)
def native_twin(model_file):
    folder = model_file(MODEL, MODEL_FILES[0]).parent
    for name in MODEL_FILES[1:]:
        assert model_file(MODEL, name).parent == folder
    run = NativeTextJobs([{"task": "embed", "folder": str(folder),
                           "sentences": SENTENCES + [LONG_SENTENCE]}])
    yield run
    run.stop()


def type_sentences(page, sentences: list[str]) -> None:
    page.fill("#similarity-input", "\n".join(sentences))


def browser_vectors(page) -> np.ndarray:
    """The last result's vectors as float32 [count, dims], bit for bit (base64 of the bytes)."""
    encoded = view_state(page, "similarity", """(() => {
        const bytes = new Uint8Array(s.lastResult.vectors.buffer);
        let binary = '';
        for (let i = 0; i < bytes.length; i += 0x8000) {
            binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        }
        return {data: btoa(binary), count: s.lastResult.count, dims: s.lastResult.dims};
    })()""")
    flat = np.frombuffer(base64.b64decode(encoded["data"]), dtype="<f4")
    return flat.reshape(encoded["count"], encoded["dims"])


def displayed_matrix(page) -> list[list[float]]:
    return page.evaluate("""() => [...document.querySelectorAll('.similarity-table tbody tr')]
        .map((tr) => [...tr.querySelectorAll('td.similarity-cell')]
        .map((td) => ({value: Number(td.dataset.value), text: td.textContent,
                       background: td.style.background})))""")


def test_empty_input_gets_an_inline_message(ready_page):
    page = ready_page
    open_view(page, "similarity")
    runs_before = view_state(page, "similarity", "s.runs")
    assert page.locator("label[for=similarity-input]").inner_text() == "Sentences, one per line"
    page.fill("#similarity-input", "  \n\n   \n")
    page.click("#similarity-button")
    error = page.locator("#similarity-error")
    error.wait_for(state="visible")
    assert error.get_attribute("role") == "alert"
    assert "Type at least one sentence" in error.inner_text()
    # Nothing was sent to the worker.
    assert view_state(page, "similarity", "[s.runs, s.busy]") == [runs_before, False]
    assert page.evaluate("() => document.activeElement.id") == "similarity-input"


def test_sentences_give_a_coloured_similarity_grid(ready_page, report):
    from candle_web import hub

    page = ready_page
    open_view(page, "similarity")
    type_sentences(page, SENTENCES)
    state = run_and_wait(page, "similarity", "#similarity-button", EMBED_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    assert page.locator("#similarity-error").is_hidden()  # the earlier message is gone
    load = state["load"]
    assert load["key"] == MODEL and load["verified"] is True
    assert load["downloadedBytes"] == hub.default_registry()[MODEL].size  # first load: all bytes
    files = {e["file"] for e in state["events"] if e["phase"] == "download" and e.get("file")}
    assert files == set(MODEL_FILES)

    result = state["result"]
    assert result["count"] == 4 and result["dims"] == 384 and result["maxTokens"] == MAX_TOKENS
    assert result["truncated"] == [False] * 4
    cells = displayed_matrix(page)
    assert [len(row) for row in cells] == [4, 4, 4, 4]
    values = np.array([[cell["value"] for cell in row] for row in cells])
    np.testing.assert_allclose(values, result["similarity"], rtol=0, atol=0)
    np.testing.assert_allclose(np.diag(values), 1.0, atol=1e-6)  # normalised vectors
    np.testing.assert_allclose(values, values.T, atol=1e-6)
    # The meaning shows: eating bread is closer to eating food than riding a horse is.
    assert values[0, 1] > values[0, 2] + 0.2
    assert cells[0][1]["text"] == f"{values[0, 1]:.2f}"
    # Coloured by value: a strong colour mix for similar pairs, a weak one for unrelated ones.
    assert "color-mix" in cells[0][1]["background"]
    assert cells[0][1]["background"] != cells[0][3]["background"]
    assert page.locator("#similarity-notice").is_hidden()
    assert page.locator("#similarity-summary").inner_text() == \
        f"Closest pair: 1 and 2 ({values[0, 1]:.2f})."
    assert page.locator(".similarity-table th[scope=row]").count() == 4
    report(f"[ui] similarity: 4 sentences embedded in {result['elapsedMs'] / 1000:.2f} s; "
           f"model load {load['timingsMs']['download'] / 1000:.1f} s download + "
           f"{load['timingsMs']['build'] / 1000:.1f} s build; cos(food, bread) "
           f"{values[0, 1]:.3f}, cos(food, horse) {values[0, 2]:.3f}")


def test_over_long_sentence_is_truncated_with_a_visible_notice(ready_page):
    page = ready_page
    type_sentences(page, SENTENCES + [LONG_SENTENCE])
    state = run_and_wait(page, "similarity", "#similarity-button", EMBED_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    assert state["events"] == []  # the model stayed loaded
    result = state["result"]
    assert result["truncated"] == [False] * 4 + [True]
    assert result["tokenCounts"][4] == MAX_TOKENS
    assert result["inputTokenCounts"][4] > MAX_TOKENS
    notice = page.locator("#similarity-notice")
    assert notice.is_visible()
    assert notice.inner_text() == (f"Truncated: sentence 5 has {result['inputTokenCounts'][4]} "
                                   f"tokens; only the first {MAX_TOKENS} tokens (the model's "
                                   "limit) were embedded.")
    assert page.locator(".similarity-table th.truncated").count() == 1
    assert len(displayed_matrix(page)) == 5


def test_twin_browser_embeddings_equal_native_numpy(ready_page, native_twin, report):
    page = ready_page
    if view_state(page, "similarity", "s.lastResult && s.lastResult.count") != 5:
        type_sentences(page, SENTENCES + [LONG_SENTENCE])  # when run alone
        assert run_and_wait(page, "similarity", "#similarity-button",
                            EMBED_TIMEOUT_MS)["error"] is None
    browser = browser_vectors(page)
    native = native_twin.result()
    assert native["backend"] == "numpy"
    twin = native["results"][0]
    native_vectors = np.array(twin["vectors"], dtype=np.float32)
    assert browser.shape == native_vectors.shape == (5, 384)
    assert view_state(page, "similarity", "s.lastResult.tokenCounts") == \
        twin["summary"]["tokenCounts"]
    difference = np.abs(browser - native_vectors)
    assert difference.max() <= TWIN_ATOL, difference.max()
    np.testing.assert_allclose(np.linalg.norm(browser, axis=1), 1.0, atol=1e-6)
    similarity_difference = np.abs(np.array(view_state(page, "similarity",
                                                       "s.lastResult.similarity"))
                                   - np.array(twin["summary"]["similarity"])).max()
    report(f"[ui] twin check (all-MiniLM-L6-v2, browser vs native numpy): max |vector "
           f"difference| {difference.max():.2e}, max |similarity difference| "
           f"{similarity_difference:.2e} (tolerance {TWIN_ATOL:g}); "
           f"{int((difference == 0).sum())} of {difference.size} components bit-identical")
