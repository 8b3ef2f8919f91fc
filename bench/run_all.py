"""Run every benchmark workload in bench/ (what `make bench` runs), each in its own process.

    python bench/run_all.py [NAME ...] [--skip NAME ...] [--list]

A workload is a bench/*.py script whose name does not start with "_" (helpers), is not this
file and is not in NOT_WORKLOADS. Each runs with this interpreter and its own defaults, one after another, so no two share
the cores or a warm cache; their tables print as they come. A script that declares
`NEEDS_CUDA = True` on a line of its own is skipped, with the reason, when no CUDA device is
usable (cupy missing or no device). NAMEs select scripts by file stem (e.g. `whisper gpu`).
At the end a summary lists each script's outcome and time; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
NEEDS_CUDA_LINE = "NEEDS_CUDA = True"
# Asked in a child process, so this process never initialises CUDA (nor imports cupy).
CUDA_PROBE = ("import cupy, sys; "
              "sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)")
CUDA_PROBE_TIMEOUT_S = 120
# revisions.py compares two commits (a check a refactor asks for, ~25 min with its own worktrees),
# not this tree against a peer: run it by hand.
NOT_WORKLOADS = {"revisions"}


def workload_scripts() -> list:
    return sorted(path for path in BENCH_DIR.glob("*.py")
                  if not path.name.startswith("_") and path.name != Path(__file__).name
                  and path.stem not in NOT_WORKLOADS)


def needs_cuda(script: Path) -> bool:
    lines = script.read_text(encoding="utf-8").splitlines()
    return any(line.strip() == NEEDS_CUDA_LINE for line in lines)


def cuda_available() -> tuple:
    """(usable, reason): whether cupy imports here and sees at least one device."""
    try:
        probe = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True,
                               text=True, timeout=CUDA_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"the CUDA probe did not answer within {CUDA_PROBE_TIMEOUT_S} s"
    if probe.returncode == 0:
        return True, ""
    last_line = (probe.stderr.strip().splitlines() or ["no CUDA device present"])[-1]
    return False, f"no usable CUDA device ({last_line})"


def child_environment() -> dict:
    env = dict(os.environ)
    paths = [str(REPO / "pkg"), str(REPO / "native")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"  # tables appear as they are printed, not at exit
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only these scripts (file stems)")
    parser.add_argument("--skip", nargs="*", default=[], help="scripts (file stems) not to run")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = parser.parse_args(argv)

    scripts = workload_scripts()
    known = {script.stem for script in scripts}
    unknown = sorted((set(args.names) | set(args.skip)) - known)
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {sorted(known)}")
    if args.names:
        scripts = [s for s in scripts if s.stem in args.names]
    scripts = [s for s in scripts if s.stem not in args.skip]
    if args.list:
        for script in scripts:
            print(f"{script.stem}{'  (needs CUDA)' if needs_cuda(script) else ''}")
        return 0

    cuda = None  # probed once, only if some script needs it
    outcomes = []
    for script in scripts:
        name = f"bench/{script.name}"
        if needs_cuda(script):
            if cuda is None:
                cuda = cuda_available()
            if not cuda[0]:
                print(f"\n##### {name}: skipped: {cuda[1]}")
                outcomes.append((name, "skipped", 0.0))
                continue
        print(f"\n##### {name}", flush=True)
        started = time.perf_counter()
        code = subprocess.call([sys.executable, str(script)], cwd=REPO, env=child_environment())
        elapsed = time.perf_counter() - started
        outcomes.append((name, "ok" if code == 0 else f"FAILED (exit status {code})", elapsed))

    print("\n##### summary")
    for name, outcome, elapsed in outcomes:
        print(f"{name:28} {outcome:28} {elapsed:8.1f} s")
    return 1 if any(outcome.startswith("FAILED") for _, outcome, _ in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
