"""Fixtures of the Firefox smoke suite: the demo server as tests/ui serves it, Debian's
firefox-esr (firefox_testlib: Node + puppeteer-core over WebDriver BiDi), a started page.

- `ui_site`, `ui_server_url`, `report` (session): tests/ui/conftest.py's own fixtures (the
  runtime vendored and the candle_web wheel rebuilt first, then `candle-web serve` in a
  thread; report prints a line in the test output).
- `firefox` (session): one headless Firefox with a fresh profile. Missing node, npm's
  puppeteer-core or firefox-esr FAILS the tests with the command that installs them (`make
  test` does); only a machine that is not Debian, where firefox-esr is not a package, skips,
  saying so.
- `firefox_guard` (session): the URLs off 127.0.0.1 the browser asked for (firefox_driver.mjs
  refuses them all); a test that made one fails at its teardown.
- `firefox_page` (session): the demo page with its worker started (shared: a start costs
  seconds); `firefox_summary` is its init result.
After each test a screenshot of the page lands in test-artifacts/ui_firefox/ (git-ignored).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.ui.conftest import (report, ui_server_url, ui_site,  # noqa: F401 (fixtures)
                               wait_until_ready)
from tests.ui_firefox.firefox_testlib import (FirefoxDriver, FirefoxError, SetupMissing,
                                              missing_setup)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts" / "ui_firefox"


def on_debian() -> bool:
    return Path("/etc/debian_version").is_file()


@pytest.fixture(scope="session")
def firefox():
    problem = missing_setup()
    if problem and not on_debian() and "firefox-esr" in problem:
        pytest.skip(f"not Debian, so no firefox-esr package to install: {problem}")
    if problem:
        pytest.fail(problem, pytrace=False)
    try:
        driver = FirefoxDriver()
    except (SetupMissing, FirefoxError) as error:
        pytest.fail(f"cannot start Firefox: {error}", pytrace=False)
    yield driver
    driver.stop()


class FirefoxGuard:
    """Hands out the browser's off-host requests not yet looked at."""

    def __init__(self, driver: FirefoxDriver):
        self.driver = driver
        self.seen = len(driver.blocked())

    def take_new(self) -> list[str]:
        urls = self.driver.blocked()
        new, self.seen = urls[self.seen:], len(urls)
        return new


@pytest.fixture(scope="session")
def firefox_guard(firefox):
    return FirefoxGuard(firefox)


@pytest.fixture(autouse=True)
def _offline_and_screenshot(request, firefox_guard):
    firefox_guard.take_new()
    yield
    page = request.node.funcargs.get("firefox_page")
    if page is not None and not page.is_closed():
        ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
        ignore_file = ARTIFACTS_DIR.parent / ".gitignore"
        if not ignore_file.exists():
            ignore_file.write_text("*\n")
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")
        try:
            page.screenshot(ARTIFACTS_DIR / f"{name}.png")
        except FirefoxError as error:  # a screenshot must never mask the test's own result
            print(f"[firefox] screenshot failed: {error}")
    blocked = firefox_guard.take_new()
    assert blocked == [], f"{len(blocked)} request(s) left 127.0.0.1 (refused): {blocked[:5]}"


@pytest.fixture(scope="session")
def firefox_page(firefox, ui_server_url, report):
    page = firefox.open(ui_server_url + "/")
    summary = wait_until_ready(page)
    page.ready_summary = summary
    report(f"\n[firefox] {firefox.version}: worker ready in {summary['totalMs'] / 1000:.2f} s "
           f"(backend {summary['backend']['name']} {summary['backend']['variant']}, "
           f"{summary['backend']['threads']} threads)")
    yield page
    page.close()


@pytest.fixture(scope="session")
def firefox_summary(firefox_page) -> dict:
    return firefox_page.ready_summary
