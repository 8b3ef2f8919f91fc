"""Before / after: bench/browser.py (the page's wasm backend on 1 and 2 threads) and
bench/whisper.py (native numpy and numba) on two git revisions, interleaved, in one run.

    .venv/bin/python bench/revisions.py [--before 9d8a863] [--after HEAD] [--repeats 3]
                                        [--clips 5] [--benchmarks browser,whisper]
                                        [--modes 'backend=wasm&threads=1,backend=wasm&threads=2']
                                        [--whisper-backends numpy,numba] [--threads 2]
                                        [--json FILE] [--prepare-only]

Each revision is checked out as a detached git worktree outside the repository,
$TMPDIR/candle-web-rev-<commit[:12]> (made once, reused by later runs while it is clean and at
that commit; a worktree there with local changes, or at another commit, is refused with what
to do). Its page is built by its own scripts: scripts/vendor_pyodide.py --offline (the wasm
kernels with its scripts/build_kernels.py, its candle_web wheel), after the Pyodide runtime
files of this checkout's web/vendor/pyodide are copied in (the old vendor script keeps
files whose sha256 it pins, so nothing is downloaded) and the Pyodide snapshot copied (its
script rebuilds it when its key differs). Python is this interpreter (the main .venv); models
come from the shared model cache (~/.cache/candle-web, or $CANDLE_WEB_CACHE): nothing is
downloaded twice. CANDLE_WEB_OFFLINE=1 is set for every child.

Then, --repeats times, before then after (A B A B ...), each in its own process:
  * browser: that tree's bench/browser.py --tasks whisper --skip-peer --skip-native with the
    same --modes, --clips and --json (both trees' drivers run the same page JavaScript and the
    same playwright.config.py launch options; every page in a fresh Chromium profile);
  * whisper: that tree's bench/whisper.py --no-torch --backends ... --clips N --threads T, with
    PYTHONPATH at that tree's pkg/ and native/ (its numba cache is its own .numba_cache, warmed
    by the script's untimed first window).
Printed at the end, one row per metric: the median of the repeats with their range [min-max]
for before and for after, after/before of the medians, the range of after/before over the
paired repeats (run i of before against run i of after), and whether the two ranges overlap
("within noise" when they do). The page's token ids are compared between the revisions clip
by clip. Each child's output is kept beside the --json file (or in a temporary folder named
at the end). Timings are only as quiet as the machine: the load average is printed per run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BEFORE = "9d8a863"  # the tree before session 7's refactor (issue 22)
DEFAULT_AFTER = "HEAD"
DEFAULT_MODES = "backend=wasm&threads=1,backend=wasm&threads=2"
BENCHMARKS = ("browser", "whisper")
WORKTREE_PREFIX = "candle-web-rev-"
# The Pyodide runtime files the page serves from web/vendor/ (not the built wheel, kernels).
SHARED_VENDOR_FILES = ("pyodide-snapshot.bin", "pyodide-snapshot.json")
CHILD_TIMEOUT_S = 3600
# bench/whisper.py's summary line per engine (the same format at 9d8a863 and at HEAD).
WHISPER_SUMMARY = re.compile(
    r"^(?P<engine>cw-\w+)\s+all clips \((?P<audio>[\d.]+) s audio\): total (?P<total>[\d.]+) s, "
    r"RTF [\d.]+, median encoder (?P<encoder>[\d.]+) ms, median decoder (?P<token>[\d.]+) "
    r"ms/token")


class RevisionError(RuntimeError):
    """A revision cannot be prepared; the message names it and says what to do."""


def git(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RevisionError(f"git {' '.join(args)} failed in {cwd}: "
                            f"{(result.stderr or result.stdout).strip()}")
    return result


def resolve(revision: str, repo: Path = REPO) -> str:
    """The full commit id of `revision`, or RevisionError naming it."""
    found = git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", cwd=repo,
                check=False)
    if found.returncode != 0 or not found.stdout.strip():
        raise RevisionError(f"unknown revision {revision!r}: not a commit in {repo} "
                            f"(git rev-parse --verify {revision!r} found nothing)")
    return found.stdout.strip()


def worktree_root() -> Path:
    return Path(tempfile.gettempdir())


def worktree_path(commit: str, root: Path | None = None) -> Path:
    return (root or worktree_root()) / f"{WORKTREE_PREFIX}{commit[:12]}"


def registered_worktrees(repo: Path = REPO) -> set[Path]:
    listed = git("worktree", "list", "--porcelain", cwd=repo).stdout
    return {Path(line[len("worktree "):]).resolve() for line in listed.splitlines()
            if line.startswith("worktree ")}


def checkout(commit: str, root: Path | None = None, repo: Path = REPO) -> Path:
    """A clean detached worktree at `commit`: made when missing, reused when it is this commit
    with no tracked file changed, refused otherwise (the message says what to do)."""
    path = worktree_path(commit, root)
    if path.exists():
        if path.resolve() not in registered_worktrees(repo):
            raise RevisionError(f"{path} exists but is not a worktree of {repo}: move it away "
                                f"or pass another --worktree-root")
        at = git("rev-parse", "HEAD", cwd=path).stdout.strip()
        if at != commit:
            raise RevisionError(f"worktree {path} is at {at[:12]}, not {commit[:12]}: remove it "
                                f"(git worktree remove --force {path})")
        changed = git("status", "--porcelain", "--untracked-files=no", cwd=path).stdout
        if changed.strip():
            files = ", ".join(line[3:] for line in changed.splitlines()[:5])
            raise RevisionError(f"worktree {path} is dirty (changed: {files}): its figures would "
                                f"not be {commit[:12]}'s; remove it (git worktree remove --force "
                                f"{path}) and run again")
        return path
    git("worktree", "prune", cwd=repo)
    path.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(path), commit, cwd=repo)
    return path


def copy_missing(source: Path, target: Path) -> None:
    """A copy, not a hard link: a vendor script writing a file in place would change ours."""
    if not target.exists():
        shutil.copy2(source, target)


def child_env(tree: Path, with_native: bool = False) -> dict:
    env = dict(os.environ)
    paths = [str(tree / "pkg")] + ([str(tree / "native")] if with_native else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["CANDLE_WEB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("NUMBA_CACHE_DIR", None)  # each tree's own .numba_cache
    return env


def build_page(tree: Path, log_dir: Path) -> dict:
    """The tree's page: this checkout's Pyodide files copied in, then its own vendor script
    (kernels, wheel, samples). Returns its wheel manifest; RevisionError when it fails."""
    source = REPO / "web" / "vendor"
    if not (source / "pyodide").is_dir():
        raise RevisionError(f"{source / 'pyodide'} is missing: run scripts/vendor_pyodide.py "
                            "in this checkout first (the revisions reuse its Pyodide files)")
    target = tree / "web" / "vendor"
    (target / "pyodide").mkdir(parents=True, exist_ok=True)
    for file in (source / "pyodide").iterdir():
        if file.is_file():
            copy_missing(file, target / "pyodide" / file.name)
    for name in SHARED_VENDOR_FILES:
        if (source / name).is_file():
            copy_missing(source / name, target / name)
    log = log_dir / f"vendor-{tree.name}.log"
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, str(tree / "scripts" / "vendor_pyodide.py"),
                               "--offline"], cwd=tree, env=child_env(tree), stdout=handle,
                              stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RevisionError(f"{tree}: scripts/vendor_pyodide.py failed (exit {done.returncode}); "
                            f"its output: {log}")
    manifest = json.loads((target / "wheels" / "manifest.json").read_text())
    if not manifest.get("kernels"):
        raise RevisionError(f"{tree}: the page has no wasm kernels (see {log}): the wasm modes "
                            "would not run")
    return manifest


def prepare(revision: str, log_dir: Path, root: Path | None = None) -> tuple[str, Path]:
    commit = resolve(revision)
    tree = checkout(commit, root)
    started = time.perf_counter()
    manifest = build_page(tree, log_dir)
    print(f"[revisions] {revision} = {commit[:12]}: {tree} (page: {manifest.get('wheel')}, "
          f"kernels {', '.join(manifest['kernels'])}; {time.perf_counter() - started:.0f} s)",
          flush=True)
    return commit, tree


# --- one run of one benchmark on one tree --------------------------------------------------

def run_child(command: list[str], tree: Path, env: dict, log: Path) -> str:
    with log.open("w") as handle:
        done = subprocess.run(command, cwd=tree, env=env, stdout=handle,
                              stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S)
    output = log.read_text()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} in {tree} exited {done.returncode}; "
                           f"last lines:\n{output[-1500:]}\n(whole output: {log})")
    return output


def browser_metrics(tree: Path, args, log_dir: Path, tag: str) -> tuple[dict, dict]:
    """(metric -> value, clip -> token ids per mode) from one run of the tree's bench/browser.py."""
    out = log_dir / f"browser-{tag}.json"
    run_child([sys.executable, str(tree / "bench" / "browser.py"), "--tasks", "whisper",
               "--skip-peer", "--skip-native", "--modes", args.modes, "--clips", str(args.clips),
               "--model", args.model, "--json", str(out)],
              tree, child_env(tree), log_dir / f"browser-{tag}.log")
    metrics, ids = {}, {}
    for mode in json.loads(out.read_text())["browser"]["modes"]:
        label = mode["query"]
        if not mode.get("available"):
            raise RuntimeError(f"{tree}: ?{label} not available: {mode.get('reason')}")
        clips = mode["clips"].values()
        timings = [clip["timings"] for clip in clips]
        metrics[f"page ?{label}: transcribe, all clips (s)"] = sum(
            t["elapsedMs"] for t in timings) / 1000
        metrics[f"page ?{label}: encoder, all clips (s)"] = sum(
            t["encodeMs"] for t in timings) / 1000
        metrics[f"page ?{label}: decoder (ms/call)"] = (
            sum(t["decodeMs"] for t in timings) / max(sum(t["decoderCalls"] for t in timings), 1))
        metrics[f"page ?{label}: page open -> ready (s)"] = mode["readyWallS"]
        metrics[f"page ?{label}: model load cold (s)"] = mode["loadCold"]["pageMs"] / 1000
        ids[label] = {file: [segment["tokens"] for segment in clip["segments"]]
                      for file, clip in mode["clips"].items()}
    return metrics, ids


def whisper_metrics(tree: Path, args, log_dir: Path, tag: str) -> tuple[dict, dict]:
    """metric -> value from one run of the tree's bench/whisper.py (its summary lines)."""
    command = [sys.executable, str(tree / "bench" / "whisper.py"), "--no-torch",
               "--backends", args.whisper_backends, "--threads", str(args.threads),
               "--model", args.model, "--clips", str(args.clips)]
    output = run_child(command, tree, child_env(tree, with_native=True),
                       log_dir / f"whisper-{tag}.log")
    metrics = {}
    for line in output.splitlines():
        found = WHISPER_SUMMARY.match(line)
        if found:
            engine = found["engine"]
            metrics[f"native {engine}: transcribe, all clips (s)"] = float(found["total"])
            metrics[f"native {engine}: encoder, median window (ms)"] = float(found["encoder"])
            metrics[f"native {engine}: decoder, median (ms/token)"] = float(found["token"])
    wanted = [b.strip() for b in args.whisper_backends.split(",") if b.strip()]
    missing = [b for b in wanted if f"native cw-{b}: transcribe, all clips (s)" not in metrics]
    if missing:
        raise RuntimeError(f"{tree}: bench/whisper.py printed no summary for {missing}; "
                           f"its output: {log_dir / f'whisper-{tag}.log'}")
    return metrics, {}


RUNNERS = {"browser": browser_metrics, "whisper": whisper_metrics}


# --- the table --------------------------------------------------------------------------------

def summarize(before: list[float], after: list[float]) -> dict:
    paired = [a / b for a, b in zip(after, before) if b > 0]
    return {
        "before": statistics.median(before), "before_range": (min(before), max(before)),
        "after": statistics.median(after), "after_range": (min(after), max(after)),
        "ratio": statistics.median(after) / statistics.median(before),
        "paired_range": (min(paired), max(paired)),
        "overlap": min(after) <= max(before) and min(before) <= max(after),
    }


def cell(median: float, bounds: tuple[float, float], repeats: int) -> str:
    if repeats == 1:
        return f"{median:.4g}"
    return f"{median:.4g} [{bounds[0]:.4g}-{bounds[1]:.4g}]"


def print_table(rows: dict, repeats: int, names: tuple[str, str]) -> None:
    labels = (f"before {names[0]}", f"after {names[1]}")
    width = max(len(name) for name in rows)
    spread = max(len(labels[0]), len(labels[1]),
                 *(len(cell(row[side], row[side + "_range"], repeats))
                   for row in rows.values() for side in ("before", "after")))
    header = (f"{'metric':{width}} | {labels[0]:>{spread}} | {labels[1]:>{spread}} | "
              f"after/before | {'paired range':>13} | noise")
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        verdict = ("- (1 run)" if repeats == 1 else
                   "within (ranges overlap)" if row["overlap"] else
                   "after slower" if row["ratio"] > 1 else "after faster")
        low, high = row["paired_range"]
        print(f"{name:{width}} | {cell(row['before'], row['before_range'], repeats):>{spread}} | "
              f"{cell(row['after'], row['after_range'], repeats):>{spread}} | "
              f"{row['ratio']:12.3f} | {f'{low:.3f}-{high:.3f}':>13} | {verdict}")


def compare_ids(before: dict, after: dict) -> list[str]:
    """Lines naming every (mode, clip) whose page token ids differ between the revisions."""
    lines = []
    for mode, clips in before.items():
        for file, ids in clips.items():
            if after.get(mode, {}).get(file) != ids:
                lines.append(f"?{mode} {file}: token ids differ between before and after")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="revision (default: %(default)s)")
    parser.add_argument("--after", default=DEFAULT_AFTER, help="revision (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per revision (A B A B ...)")
    parser.add_argument("--clips", type=int, default=5, help="LibriVox clips (1-5)")
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                        help=f"comma-separated, of {', '.join(BENCHMARKS)}")
    parser.add_argument("--modes", default=DEFAULT_MODES,
                        help="bench/browser.py --modes (default: %(default)s)")
    parser.add_argument("--whisper-backends", default="numpy,numba",
                        help="bench/whisper.py --backends (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="bench/whisper.py --threads")
    parser.add_argument("--worktree-root", type=Path, default=None,
                        help="where the worktrees go (default: $TMPDIR or /tmp)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every run's figures here; the children's logs go beside it")
    parser.add_argument("--prepare-only", action="store_true",
                        help="make and build the two trees, run nothing")
    args = parser.parse_args(argv)
    benchmarks = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    if not benchmarks or set(benchmarks) - set(BENCHMARKS):
        parser.error(f"--benchmarks: choose from {', '.join(BENCHMARKS)}")
    if args.repeats < 1 or not 1 <= args.clips <= 5:
        parser.error("--repeats must be >= 1 and --clips 1..5")
    if args.json is not None:
        log_dir = args.json.resolve().parent / (args.json.stem + "-logs")
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="candle-web-revisions-"))
    started = time.perf_counter()
    try:
        (before, before_tree), (after, after_tree) = (
            prepare(revision, log_dir, args.worktree_root) for revision in (args.before, args.after))
    except (RevisionError, subprocess.TimeoutExpired) as error:
        print(f"revisions: {error}", file=sys.stderr)
        return 2
    if args.prepare_only:
        return 0
    trees = {"before": before_tree, "after": after_tree}
    runs = {side: [] for side in trees}
    ids = {side: {} for side in trees}
    for repeat in range(args.repeats):
        for side, tree in trees.items():  # A B A B ...
            figures = {}
            for benchmark in benchmarks:
                tag = f"{side}-{repeat + 1}"
                try:
                    metrics, run_ids = RUNNERS[benchmark](tree, args, log_dir, tag)
                except (RuntimeError, subprocess.TimeoutExpired) as error:
                    print(f"revisions: {benchmark} on {side} ({tree}), run {repeat + 1}: {error}",
                          file=sys.stderr)
                    return 1
                figures.update(metrics)
                ids[side] = ids[side] or run_ids
            load = os.getloadavg()
            runs[side].append({"figures": figures, "load": load})
            print(f"[revisions] run {repeat + 1}/{args.repeats} {side}: done, load average "
                  f"{load[0]:.1f} / {load[1]:.1f} ({time.perf_counter() - started:.0f} s in)",
                  flush=True)
    rows = {name: summarize([run["figures"][name] for run in runs["before"]],
                            [run["figures"][name] for run in runs["after"]])
            for name in runs["before"][0]["figures"]}
    if args.json is not None:
        args.json.write_text(json.dumps({"before": before, "after": after, "runs": runs,
                                         "rows": rows}, indent=1))
    print(f"\nbefore {args.before} = {before[:12]}, after {args.after} = {after[:12]}; "
          f"{args.repeats} run(s) each, interleaved; {args.clips} clip(s), {args.model}; "
          f"median [min-max] of the runs")
    print_table(rows, args.repeats, (before[:9], after[:9]))
    differ = compare_ids(ids["before"], ids["after"])
    if "browser" in benchmarks:
        print("\n".join(differ) if differ else "page token ids: the same before and after on "
              "every clip and mode")
    loads = [run["load"][0] for side in runs.values() for run in side]
    print(f"load average (1 min) after each run: {min(loads):.1f}-{max(loads):.1f}; "
          f"{time.perf_counter() - started:.0f} s in all; logs in {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
