"""A model Firefox cannot keep still runs, and the page says why (issue 37, tests/ui's
test_model_cache_failure.py in Firefox).

No patching here: a second Firefox whose storage is really small
(dom.quotaManager.temporaryStorage.fixedLimit: 50 MiB for all sites; then
navigator.storage.estimate() reports a 10 MiB quota for this one, and a put of 30 MB of
random bytes fails with NS_ERROR_FILE_NO_DEVICE_SPACE, as on a full disk: both seen in
Firefox ESR 153). The page sees before the download that the 98 MB SmolLM2 will not fit,
does not offer it to the cache, says so, and runs it from the downloaded bytes with the ids of
the native twin (which a page that keeps it computes: tests/ui); a reload downloads it again
and runs again; nothing half-written stays.
"""
from __future__ import annotations

import re

import pytest
from tests.ui.conftest import wait_until_ready
from tests.ui.test_model_cache_failure import (CACHED_KEYS_JS, GGUF, GREEDY, LABEL, MODEL,
                                              QUESTION, generate)
from tests.ui.text_views_testlib import NativeTextJobs
from tests.ui_firefox.firefox_testlib import FirefoxDriver

pytestmark = pytest.mark.ui

# KiB for every site together (Firefox's temporary storage limit).
SMALL_STORAGE_KIB = 50 * 1024


@pytest.fixture(scope="module")
def small_storage_firefox(firefox):  # after the session's Firefox: it checked the set-up
    driver = FirefoxDriver(prefs={"dom.quotaManager.temporaryStorage.fixedLimit":
                                  SMALL_STORAGE_KIB})
    yield driver
    driver.stop()


@pytest.fixture(scope="module")
def native_greedy(model_file):
    run = NativeTextJobs([{"task": "generate", "gguf": str(model_file(MODEL, GGUF)),
                           "prompt": QUESTION, "chat": True, "options": GREEDY}])
    yield run
    run.stop()


def free_megabytes(reason: str) -> float:
    match = re.search(r"has ([\d.]+) MB free$", reason)
    assert match, reason
    return float(match.group(1))


def test_a_model_firefox_cannot_keep_runs_from_the_download_and_says_why(
        small_storage_firefox, ui_server_url, native_greedy, report):
    from candle_web import hub

    size = hub.default_registry()[MODEL].size
    page = small_storage_firefox.open(ui_server_url + "/")
    try:
        wait_until_ready(page)
        quota = page.evaluate("() => navigator.storage.estimate().then((e) => e.quota)")
        assert quota < size  # what this browser really offers this page

        first = generate(page)
        load = first["load"]
        assert load["cached"] is False and load["downloadedBytes"] == size
        reason = load["notKept"]["reason"]
        assert load["notKept"]["bytes"] == size
        assert reason.startswith(f"it needs {size / 1e6:.1f} MB and this browser's storage "
                                 "for this page has ")
        assert free_megabytes(reason) <= quota / 1e6
        assert f"Could not keep {LABEL} in this browser's storage ({reason})" in first["note"]
        events = [(e["phase"], e["state"]) for e in first["events"]]
        assert events.index(("download", "not-kept")) < events.index(("download", "running"))
        assert page.evaluate(CACHED_KEYS_JS, GGUF) == []  # nothing half-written kept

        page.reload()
        wait_until_ready(page)
        second = generate(page)
        assert second["load"]["cached"] is False and second["load"]["downloadedBytes"] == size
        assert second["result"]["tokenIds"] == first["result"]["tokenIds"]
    finally:
        page.close()
    assert small_storage_firefox.blocked() == []  # offline: nothing asked for off 127.0.0.1
    native = native_greedy.result()["results"][0]
    assert first["result"]["promptIds"] == native["promptIds"]
    assert first["result"]["tokenIds"] == native["tokenIds"]
    report(f"[firefox] SmolLM2 with {quota / 2**20:.0f} MiB of storage: not kept ({reason}), "
           f"ran twice from the download with the native twin's "
           f"{len(native['tokenIds'])} ids")
