"""`candle-web batch transcribe` on a local Ray (1 and 2 actors) beside plain loops over
`candle-web transcribe`, on the batch tests' clips (17 clips cut from the test speech, 1.5-7 s).

    .venv/bin/python bench/batch.py [--actors 1,2] [--copies 1] [--skip-per-file-loop]

Rows, each a fresh process and a fresh --out:
  - loop, one process per file:  `for f in clips; do candle-web transcribe $f; done`
  - loop, one process:           `candle-web transcribe clip1 clip2 ...` (the model loads once)
  - batch, N actors:             `candle-web batch transcribe list.txt --concurrency N` (local
                                 Ray; each actor's kernels on all cores, the CLI's threads)
  - batch, N actors, T threads:  the same with --threads-per-actor T = cores / N
For each: wall time of the whole command (process start, Ray start, model load included), files
per minute and audio hours per hour over that wall time; for the batch also the steady rate,
from the spread of the rows' finished_at (first to last result: start-up excluded), and the
mean model seconds per file (what one actor does, from the rows' transcribe_seconds). At the end
a note: what N machines would give, from the per-actor figure, and where that stops scaling.
`--copies K` repeats the clip set K times (distinct files) for a longer run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO)]


def env() -> dict:
    out = dict(os.environ, PYTHONPATH=f"{REPO / 'pkg'}:{REPO / 'native'}",
               CANDLE_WEB_OFFLINE=os.environ.get("CANDLE_WEB_OFFLINE", "1"),
               RAY_USAGE_STATS_ENABLED="0")
    out.pop("RAY_ADDRESS", None)  # always a local Ray here
    return out


def cli(*args) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "candle_web.cli", *map(str, args)],
                          capture_output=True, text=True, env=env())
    if done.returncode != 0:
        raise SystemExit(f"candle-web {' '.join(map(str, args[:3]))} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def make_inputs(folder: Path, copies: int) -> tuple[list[str], float]:
    from candle_web import hub
    from candle_web.io.audio import load_audio

    from tests.batch.clips_testlib import make_clips

    speech = hub.cache_dir() / "testdata" / "speech"
    if not (speech / "librivox").is_dir():
        raise SystemExit("test speech is missing: run `make models` (scripts/fetch_test_audio.sh)")
    paths = []
    for copy in range(copies):
        made = make_clips(speech, folder / f"set{copy}")
        paths += made["good"]
    seconds = sum(len(load_audio(path)) / 16000 for path in paths)
    return paths, seconds


def batch_rows(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for path in (out / "results").glob("status=done/*.parquet"):
        rows += pq.read_table(path, columns=["finished_at", "transcribe_seconds",
                                             "audio_seconds", "worker"]).to_pylist()
    return rows


def row(name, files, audio_s, wall, steady=None, per_file=None):
    rate = files / wall * 60
    line = (f"{name:32} {wall:8.1f} {rate:9.1f} {audio_s / wall:8.2f}")
    line += f" {steady:12.1f}" if steady is not None else f" {'-':>12}"
    line += f" {per_file:10.2f}" if per_file is not None else f" {'-':>10}"
    print(line, flush=True)
    return rate


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,2", help="actor counts to run, comma-separated")
    parser.add_argument("--copies", type=int, default=1, help="repeat the clip set K times")
    parser.add_argument("--skip-per-file-loop", action="store_true")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cw-bench-batch-"))
    try:
        paths, audio_s = make_inputs(work, args.copies)
        listing = work / "inputs.txt"
        listing.write_text("\n".join(paths) + "\n")
        load = os.getloadavg()[0]
        print(f"{len(paths)} clips, {audio_s:.1f} s of audio, whisper-tiny.en, greedy with "
              f"fallback (the CLI defaults); {os.cpu_count()} CPUs, load average {load:.1f} at start")
        print(f"{'':32} {'wall s':>8} {'files/min':>9} {'audio h/h':>8} {'steady f/min':>12} "
              f"{'model s/file':>10}")
        rates = {}
        if not args.skip_per_file_loop:
            wall = sum(cli("transcribe", path) for path in paths)
            rates["per-file"] = row("loop, one process per file", len(paths), audio_s, wall)
        out = work / "loop"
        wall = cli("transcribe", *paths, "--format", "json", "--output-dir", out)
        rates["one-process"] = row("loop, one process", len(paths), audio_s, wall)
        per_actor = {}
        cores = os.cpu_count() or 1
        runs = []
        for actors in [int(a) for a in args.actors.split(",") if a]:
            runs.append((actors, None))
            if actors > 1 and cores // actors >= 1:
                runs.append((actors, cores // actors))  # threads x actors = cores
        for actors, threads in runs:
            out = work / f"batch-{actors}-{threads}"
            extra = ["--threads-per-actor", threads] if threads else []
            wall = cli("batch", "transcribe", listing, "--out", out, "--concurrency", actors, *extra)
            rows = batch_rows(out)
            finished = sorted(r["finished_at"] for r in rows)
            spread = (finished[-1] - finished[0]).total_seconds() if len(finished) > 1 else 0.0
            steady = (len(finished) - 1) / spread * 60 if spread > 0 else None
            model_s = sum(r["transcribe_seconds"] for r in rows) / len(rows)
            label = f"batch, {actors} actor(s)" + (f", {threads} thread(s) each" if threads else "")
            key = f"batch-{actors}" + (f"x{threads}t" if threads else "")
            rates[key] = row(label, len(rows), audio_s, wall, steady, model_s)
            per_actor[key] = (steady, model_s)
        print(json.dumps({"load_average_end": round(os.getloadavg()[0], 1), "files_per_min": {
            k: round(v, 1) for k, v in rates.items()}}))
        one = per_actor.get("batch-1")
        if one and one[1]:
            per_actor_rate = 60 / one[1]
            scaling = ", ".join(f"{key}: {value[0] / one[0]:.2f}x the 1-actor steady rate"
                                for key, value in per_actor.items()
                                if key != "batch-1" and value[0] and one[0])
            print(f"\nnote: one actor transcribes ~{per_actor_rate:.0f} files/min of these clips "
                  f"({one[1]:.2f} model s per file; each clip is padded to a 30 s window, so the "
                  "encoder costs the same for a 2 s and a 30 s file). "
                  + (f"On this machine: {scaling}. " if scaling else "")
                  + f"N machines with k actors each give up to ~N*k*{per_actor_rate:.0f} files/min "
                  "while the actors' threads fit the cores (by default an actor's kernels use all "
                  "of its node's threads; --threads-per-actor T with k*T = cores avoids "
                  "oversubscription). It stops scaling at: (1) start-up: Ray's, then the model "
                  "load, once per actor (~1-3 s for tiny.en, tens of seconds for larger models), "
                  "which dominate short runs (the gap between the wall and the steady rate "
                  "above); (2) I/O: each input is read twice (hash, decode) from storage all "
                  "nodes share, and its decoded audio (230 MB per hour at 16 kHz float32) moves "
                  "through the object store to the actor; (3) the driver: one Ray Data driver "
                  "schedules a task per file and each result lands as a small Parquet file: "
                  "fine for files that take seconds, a limit for thousands of tiny files a second.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
