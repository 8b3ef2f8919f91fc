"""Firefox for the UI tests: Debian's firefox-esr driven by firefox_driver.mjs (Node, npm's
puppeteer-core over WebDriver BiDi), in a subprocess spoken to in JSON lines.

`FirefoxPage` offers the few Playwright page methods the Chromium tests' helpers use
(evaluate, wait_for_function, click, fill, set_checked, select_option, dispatch_event, reload,
page_log), so tests/ui's helpers (wait_until_ready, text_views_testlib, transcribe_testlib)
drive Firefox unchanged. Every call is bounded: the driver gives up on a command after its
timeout, and this side kills the driver and its browser when no reply comes a margin later.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
from collections import deque
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER_SCRIPT = Path(__file__).with_name("firefox_driver.mjs")
PUPPETEER_PACKAGE = REPO_ROOT / "node_modules" / "puppeteer-core" / "package.json"
FIREFOX_EXECUTABLE = os.environ.get("CANDLE_WEB_FIREFOX", "/usr/bin/firefox-esr")
# Playwright's default in tests/ui (playwright.config.py ACTION_TIMEOUT_MS), for actions and
# waits that name no timeout.
DEFAULT_TIMEOUT_MS = 30_000
# Playwright's evaluate has no timeout (tests/ui's helpers bound their own promises); this
# one is bounded all the same, under pytest-timeout's 900 s.
EVALUATE_TIMEOUT_MS = 600_000
# Firefox's start on a busy 2-core machine: seconds; a stuck one fails within this.
LAUNCH_TIMEOUT_S = 120
# How long past a command's own timeout the driver may take to answer before it counts as hung.
REPLY_MARGIN_S = 30


class FirefoxError(AssertionError):
    """A command the browser did not carry out (its error, or no answer in time)."""


class SetupMissing(Exception):
    """What the standard set-up should have installed is not there: the message says what."""


def missing_setup() -> str | None:
    """Why Firefox cannot be driven here, or None: node, npm's puppeteer-core, firefox-esr."""
    if shutil.which("node") is None:
        return "node is not installed: run `make node-deps` (Debian's nodejs and npm)"
    if not PUPPETEER_PACKAGE.is_file():
        return (f"{PUPPETEER_PACKAGE.parent} is missing: run `make node-deps` (npm ci of "
                "package-lock.json; PUPPETEER_SKIP_DOWNLOAD, no browser is downloaded)")
    if not Path(FIREFOX_EXECUTABLE).is_file():
        return (f"{FIREFOX_EXECUTABLE} not found: run `make system-deps` (Debian's firefox-esr) "
                "or set CANDLE_WEB_FIREFOX to a Firefox binary")
    return None


class FirefoxDriver:
    """firefox_driver.mjs in a subprocess: one browser, commands answered in order."""

    def __init__(self, prefs: dict | None = None):
        problem = missing_setup()
        if problem:
            raise SetupMissing(problem)
        config = {"executablePath": FIREFOX_EXECUTABLE, "prefs": prefs or {}}
        # Its own session, so the whole tree (node and the browser it starts) can be ended.
        self.process = subprocess.Popen(
            [shutil.which("node"), str(DRIVER_SCRIPT), json.dumps(config)], cwd=REPO_ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self._replies: queue.Queue = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=60)
        threading.Thread(target=self._read_replies, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._next_id = 1
        self.browser_pid = None
        started = self._wait_reply(0, LAUNCH_TIMEOUT_S, "launch")
        self.version = started["version"]
        self.browser_pid = started["browserPid"]

    def _read_replies(self) -> None:
        for line in self.process.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self._stderr.append(line.rstrip("\n"))

    def _wait_reply(self, command_id: int, timeout_s: float, what: str):
        while True:
            try:
                line = self._replies.get(timeout=timeout_s)
            except queue.Empty:
                self.stop()
                raise FirefoxError(f"firefox driver: no answer to {what} in {timeout_s:.0f} s "
                                   f"(driver and browser killed); stderr:\n{self.stderr_tail()}")
            if line is None:
                raise FirefoxError(f"firefox driver exited ({self.process.wait()}) during "
                                   f"{what}; stderr:\n{self.stderr_tail()}")
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not a reply (a stray line on stdout)
            if message.get("id") != command_id:
                continue
            if not message["ok"]:
                raise FirefoxError(f"firefox {what}: {message['error']}")
            return message["value"]

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def command(self, op: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, **fields):
        if self.process.poll() is not None:
            raise FirefoxError(f"firefox driver is not running (exit {self.process.returncode})")
        command_id = self._next_id
        self._next_id += 1
        line = json.dumps({"id": command_id, "op": op, "timeoutMs": timeout_ms, **fields})
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._wait_reply(command_id, timeout_ms / 1000 + REPLY_MARGIN_S, op)

    def open(self, url: str, private_context: bool = False) -> "FirefoxPage":
        page_id = self.command("open", url=url, privateContext=private_context)
        return FirefoxPage(self, page_id)

    def blocked(self) -> list[str]:
        """Every URL off 127.0.0.1 the browser asked for (all refused), in order."""
        return self.command("blocked")

    def stop(self) -> None:
        """Quit the browser: politely (the driver closes it and exits 0), else by killing the
        driver's and the browser's process groups, which only they are in."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"id": -1, "op": "quit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() == 0:
            return
        for group in (self.process.pid, self.browser_pid):
            if group:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.process.wait()


class PageLog:
    """The page's console lines and uncaught errors, read from the driver when asked."""

    def __init__(self, page: "FirefoxPage"):
        self._page = page

    @property
    def console(self) -> list[str]:
        return self._page.driver.command("log", page=self._page.page_id)["console"]

    @property
    def errors(self) -> list[str]:
        return self._page.driver.command("log", page=self._page.page_id)["errors"]


class FirefoxPage:
    """One tab, with the subset of Playwright's Page that tests/ui's helpers call."""

    def __init__(self, driver: FirefoxDriver, page_id: int):
        self.driver = driver
        self.page_id = page_id
        self.page_log = PageLog(self)
        self.closed = False

    def _command(self, op: str, timeout: float | None = None, **fields):
        return self.driver.command(op, timeout_ms=int(timeout or DEFAULT_TIMEOUT_MS),
                                   page=self.page_id, **fields)

    def evaluate(self, expression: str, arg=None, timeout: float = EVALUATE_TIMEOUT_MS):
        return self._command("evaluate", timeout, source=expression, arg=arg)

    def wait_for_function(self, expression: str, arg=None, timeout: float | None = None):
        return self._command("waitForFunction", timeout, source=expression, arg=arg)

    def click(self, selector: str, timeout: float | None = None) -> None:
        self._command("click", timeout, selector=selector)

    def select_option(self, selector: str, value: str) -> None:
        self._command("select", selector=selector, value=value)

    def fill(self, selector: str, value: str) -> None:
        """As Playwright's fill does: the new value, then an input event."""
        self.evaluate("""([selector, value]) => {
            const element = document.querySelector(selector);
            if (!element) throw new Error(`no element ${selector}`);
            element.value = value;
            element.dispatchEvent(new Event('input', {bubbles: true}));
        }""", [selector, value])

    def set_checked(self, selector: str, checked: bool) -> None:
        """A click where the box is not already as wanted (input and change events follow)."""
        if self.evaluate("(s) => document.querySelector(s).checked", selector) != checked:
            self.click(selector)

    def dispatch_event(self, selector: str, event_type: str) -> None:
        self.evaluate("""([selector, type]) => document.querySelector(selector)
            .dispatchEvent(new Event(type, {bubbles: true}))""", [selector, event_type])

    def inner_text(self, selector: str) -> str:
        return self.evaluate("(s) => document.querySelector(s).innerText", selector)

    def text_content(self, selector: str) -> str:
        return self.evaluate("(s) => document.querySelector(s).textContent", selector)

    def reload(self) -> None:
        self._command("reload", timeout=120_000)

    def set_viewport_size(self, size: dict) -> None:
        """As Playwright's: {"width": ..., "height": ...} CSS pixels."""
        self._command("viewport", width=size["width"], height=size["height"])

    def screenshot(self, path: str) -> str:
        return self._command("screenshot", path=str(path))

    def is_closed(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed and self.driver.process.poll() is None:
            self._command("close")
        self.closed = True
