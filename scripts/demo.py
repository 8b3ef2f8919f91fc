#!/usr/bin/env python3
"""`make demo`: the demo page first, the optional first-run work after it.

    python scripts/demo.py [--port 8000] [--host 127.0.0.1] [--quiet]
                           [--first-run warm-up,transcribe,generate,t5 | none] [--t5-steps N]

1. Serves the page (candle_web.serve, in a thread of this process) and prints its URL as soon
   as it answers. Transcription, generation and similarity run in the browser on the cached
   model files, so none of the work below has to come first.
2. Then, in the background, one step at a time, each in a subprocess whose output lines are
   printed prefixed "[demo <step>]" (readable next to the server's request log):
     warm-up     python -m candle_native.numba.warm: the numba kernels, compiled into the kernel
                 cache (~30 s cold, a few seconds warm), so later native runs start quickly
     transcribe  candle-web transcribe of a LibriVox clip from the cache: its text is the
                 demo's proof that the native twin works
     generate    candle-web generate --chat, 12 tokens: compiles the LLaMA decode kernels
                 into the cache (a first generation measured 32 s cold, 5.6 s warm)
     t5          examples/t5_spell_numbers.py --if-missing: trains the Text-to-text view's
                 demo model (2-4 min, once) into <cache>/demo/t5-spell-numbers/, keeping its
                 progress in <cache>/demo/t5-spell-numbers.progress.json, which the server
                 serves and the page shows ("demo model still training: 40%")
   A step that fails is reported and the next one runs; the server keeps serving.
3. Ctrl-C or SIGTERM stops the running step (SIGTERM to its process group, SIGKILL after a
   grace period), then the server; nothing is left running.

Subprocesses rather than threads: numba compilation and training hold the GIL for long
stretches, which would stall the server's threads, and a subprocess can be stopped at any
moment with a signal.
"""
from __future__ import annotations

import argparse
import codecs
import importlib.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from candle_web import hub, serve

REPO_ROOT = Path(__file__).resolve().parents[1]
T5_EXAMPLE = REPO_ROOT / "examples" / "t5_spell_numbers.py"
DEMO_T5_NAME = "t5-spell-numbers"  # web/text2text.js looks for models/local/<this>/
PROOF_CLIP = Path("testdata/speech/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
GENERATE_PROMPT = "What is the capital of France?"
GENERATE_TOKENS = "12"  # enough to compile the decode step; the answer is not the point
STEPS = ("warm-up", "transcribe", "generate", "t5")
NO_STEPS = "none"
# How long a step may take to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE_S = 5.0
# How often the reader of a step's output looks whether a stop was asked for.
STOP_POLL_S = 0.2
# The server is in this process, so it answers at once; this bounds a broken set-up.
ANSWER_TIMEOUT_S = 10.0
READ_CHUNK_BYTES = 1 << 16


def log(step: str, text: str) -> None:
    print(f"[demo {step}] {text}" if step else f"[demo] {text}", flush=True)


# -- the first-run steps ----------------------------------------------------------------------

def step_command(step: str, t5_steps) -> tuple[list, str]:
    """(argv, "") for a step, or ([], why it is skipped)."""
    python = sys.executable
    if step == "warm-up":
        if importlib.util.find_spec("numba") is None:
            return [], "numba is not installed (the `native` extra): nothing to compile"
        return [python, "-m", "candle_native.numba.warm"], ""
    if step == "transcribe":
        clip = hub.cache_dir() / PROOF_CLIP
        if not clip.is_file():
            return [], f"{clip} is missing (`make models` fetches it)"
        return [python, "-m", "candle_web.cli", "transcribe", str(clip)], ""
    if step == "generate":
        return [python, "-m", "candle_web.cli", "generate", "--chat",
                "--max-tokens", GENERATE_TOKENS, GENERATE_PROMPT], ""
    if step == "t5":
        argv = [python, str(T5_EXAMPLE), "--out", str(serve.demo_models_root() / DEMO_T5_NAME),
                "--if-missing", "--progress", str(serve.demo_progress_path(DEMO_T5_NAME))]
        if t5_steps is not None:
            argv += ["--steps", str(t5_steps)]
        return argv, ""
    raise ValueError(f"unknown first-run step {step!r}")


def last_states(text: str) -> list:
    """The lines of `text`, each as its last state: a progress bar redraws its line with \\r,
    and only what it ends with is worth a line in a log."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


class FirstRunWork(threading.Thread):
    """Runs the steps one after the other; stop() ends the running one and skips the rest.

    Only this thread starts, signals and reaps the subprocesses, so a process group is never
    signalled after its leader was reaped (when its id could belong to someone else)."""

    def __init__(self, steps, t5_steps=None):
        super().__init__(name="candle-web-demo-first-run", daemon=True)
        self.steps = list(steps)
        self.t5_steps = t5_steps
        self._stop_asked = threading.Event()
        self.outcomes: dict = {}  # step -> "done in 3.2 s" | "skipped" | "failed (exit 1)" ...

    def stop(self) -> None:
        self._stop_asked.set()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        started = time.perf_counter()
        for step in self.steps:
            if self._stop_asked.is_set():
                return
            argv, skipped = step_command(step, self.t5_steps)
            if skipped:
                log(step, f"skipped: {skipped}")
                self.outcomes[step] = "skipped"
                continue
            self.outcomes[step] = self._run_step(step, argv)
            if step == "t5":
                # The trainer removes it itself, unless it had to be killed: a leftover would
                # tell the page that training goes on.
                serve.demo_progress_path(DEMO_T5_NAME).unlink(missing_ok=True)
        if self._stop_asked.is_set():
            return
        summary = ", ".join(f"{step} {outcome}" for step, outcome in self.outcomes.items())
        log("", f"first-run work finished in {time.perf_counter() - started:.1f} s "
                f"({summary}); the page keeps being served, Ctrl-C stops it")

    def _run_step(self, step: str, argv: list) -> str:
        started = time.perf_counter()
        # Its own session (process group): the terminal's Ctrl-C reaches this launcher alone,
        # which stops the step itself; and one signal to the group reaches any grandchild.
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
        log(step, f"started (pid {process.pid}): {' '.join(argv[1:])}")
        self._relay_output(step, process)
        if self._stop_asked.is_set() and process.returncode is None:
            self._terminate(process)
        returncode = process.wait()
        spent = time.perf_counter() - started
        if self._stop_asked.is_set():
            return "stopped"
        if returncode != 0:
            log(step, f"failed (exit {returncode}) after {spent:.1f} s; the page is not "
                      "affected (this step is optional)")
            return f"failed (exit {returncode})"
        log(step, f"done in {spent:.1f} s")
        return f"done in {spent:.1f} s"

    def _relay_output(self, step: str, process) -> None:
        """Print the step's output line by line until it closes it or a stop is asked for."""
        descriptor = process.stdout.fileno()
        # Incremental: a chunk may end inside a character (a progress bar's "█" is 3 bytes).
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        while not self._stop_asked.is_set():
            readable, _, _ = select.select([descriptor], [], [], STOP_POLL_S)
            if not readable:
                continue
            chunk = os.read(descriptor, READ_CHUNK_BYTES)
            if not chunk:
                break
            *lines, pending = last_states(pending + decoder.decode(chunk))
            for line in lines:
                if line.strip():
                    log(step, line)
        if pending.strip() and not self._stop_asked.is_set():
            log(step, last_states(pending)[-1])
        process.stdout.close()

    @staticmethod
    def _terminate(process) -> None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(STOP_GRACE_S)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


# -- the server ------------------------------------------------------------------------------

class StopRequested(Exception):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


def _raise_stop(signum, frame):
    raise StopRequested()


def wait_until_answering(url: str) -> None:
    request = urllib.request.Request(url, method="HEAD")
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def parse_steps(text: str) -> list:
    if text == NO_STEPS:
        return []
    steps = [step.strip() for step in text.split(",") if step.strip()]
    unknown = [step for step in steps if step not in STEPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step(s) {', '.join(unknown)}; "
                                         f"choose from {', '.join(STEPS)} or {NO_STEPS}")
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="The demo page first, the optional first-run work after it.")
    parser.add_argument("--port", type=int, default=serve.DEFAULT_PORT,
                        help=f"port (default {serve.DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--host", default=serve.DEFAULT_HOST)
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    parser.add_argument("--first-run", type=parse_steps, default=list(STEPS), metavar="STEPS",
                        help=f"comma-separated steps to run after the server starts, in order "
                             f"(default {','.join(STEPS)}; {NO_STEPS}: none)")
    parser.add_argument("--t5-steps", type=int, default=None,
                        help="training steps for the demo T5 (default: the example's)")
    args = parser.parse_args(argv)

    # Quiet until the URL is out: the launcher's own check is not worth a log line.
    site = serve.make_site_config(verbose=False, demo_root=serve.demo_models_root())
    try:
        server, url = serve.start_in_thread(args.host, args.port, site)
    except OSError as error:
        print(f"candle-web demo: cannot listen on {args.host}:{args.port}: {error}",
              file=sys.stderr)
        return 1
    work = FirstRunWork(args.first_run, args.t5_steps)
    signal.signal(signal.SIGTERM, _raise_stop)
    try:
        wait_until_answering(url)
        site.verbose = not args.quiet
        serve.announce(site, url, args.host)
        if work.steps:
            log("", f"the page works now; first-run work in the background: "
                    f"{', '.join(work.steps)}")
            work.start()
        while True:  # the server thread runs until stopped; wake up to take signals
            time.sleep(3600)
    except (KeyboardInterrupt, StopRequested):
        print("candle-web: stopping", flush=True)
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave a step running; the
        # clean-up is bounded (STOP_GRACE_S, then SIGKILL).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        work.stop()
        server.shutdown()
        server.server_close()
    print("candle-web: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
