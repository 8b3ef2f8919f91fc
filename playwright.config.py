"""Browser launch settings shared by the UI tests (tests/ui) and anything else that drives
the demo page headlessly.

Python Playwright has no config-file convention of its own; tests/ui/conftest.py loads this
file by path (the name cannot be imported as `playwright.config`, which is the Playwright
package's namespace).

The browser is Debian's chromium (`apt-get install -y chromium`), never a downloaded build:
`playwright install` is not used anywhere. The flags keep it from reaching the network on its
own (updates, sync, safe-browsing lists, QUIC probes) so the only requests are the page's,
which the tests route and check.
"""
from __future__ import annotations

import os

CHROMIUM_EXECUTABLE = os.environ.get("CANDLE_WEB_CHROMIUM", "/usr/bin/chromium")

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",  # we run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

# Passed to BrowserType.launch_persistent_context together with a fresh, empty user-data
# folder per browser, so no state (Cache API, service workers, HTTP cache) survives a run.
LAUNCH_OPTIONS = {
    "executable_path": CHROMIUM_EXECUTABLE,
    "args": CHROMIUM_ARGS,
    # Playwright would add its own old-style --headless; the new headless mode is asked for
    # explicitly in CHROMIUM_ARGS instead.
    "headless": False,
    "viewport": {"width": 1280, "height": 800},
}

# A cold start (Pyodide + numpy + scipy + candle_web) takes a few seconds on an idle 2-core
# machine and ~60 s when eight other processes share those cores; allow twice that.
PAGE_READY_TIMEOUT_MS = 120_000
ACTION_TIMEOUT_MS = 30_000
