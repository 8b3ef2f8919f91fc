"""candle-web's parser fuzzer: mutated real files against every parser, in a capped child.

    python tests/fuzz/harness.py --seconds 60            # every target, 60 s each (make fuzz)
    python tests/fuzz/harness.py --targets gguf,wav --cases 500
    python tests/fuzz/harness.py --replay gguf tests/fuzz/findings/gguf/<file>.bin
    python tests/fuzz/harness.py --list

How a case runs: the parent builds the seeds (seeds_testlib: real files from the model cache and
small files made from them), mutates one deterministically from (--seed, target, case number)
(mutators_testlib), and sends it to a child process (fuzz_worker) that runs the target
(targets_testlib) under a 2 GiB address-space cap. The case passes when the target returns or
raises a CandleError. It is a finding when it raises anything else ("untyped"), runs past the
per-case limit ("hang": the parent kills the child and starts a new one), raises MemoryError
under the cap ("memory": an allocation beyond the bound), or kills the child ("crash").

Findings are grouped by (kind, exception type, code site = the last frame in pkg/candle_web);
the first inputs of each group are saved under --findings (git-ignored) with a .txt note, and
the report prints the command that replays each. The exit status is 1 when anything was found.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pickle
import re
import resource
import select
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
REPO_ROOT = FUZZ_DIR.parent.parent
# Run as a script: the package sources, and the repo root for the tests.fuzz modules.
for _folder in (REPO_ROOT / "native", REPO_ROOT / "pkg", REPO_ROOT):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from tests.fuzz import seeds_testlib  # noqa: E402  (needs the paths above)
from tests.fuzz import targets_testlib  # noqa: E402
from tests.fuzz.mutators_testlib import case_rng, mutate  # noqa: E402
from tests.fuzz.fuzz_worker import LENGTH, choose_site, relative_site, run_case  # noqa: E402

WORKER = FUZZ_DIR / "fuzz_worker.py"
DEFAULT_FINDINGS = FUZZ_DIR / "findings"
# The outside review's settings: 2 GiB of address space, 10 s per case.
DEFAULT_MEMORY_BYTES = 2 << 30
DEFAULT_CASE_SECONDS = 10.0
# Starting a child imports numpy and candle_web: not part of any case's time.
CHILD_START_SECONDS = 60.0
# A fresh child now and then, so that a leak or a cache filled by earlier cases cannot make
# later cases fail (or pass) for reasons of their own.
CASES_PER_CHILD = 2000
MAX_SAVED_PER_GROUP = 3
# A config.json target is fuzzed mostly from its own model's configs, a little from the others.
OTHER_KIND_WEIGHT = 0.1
FINDING_KINDS = ("untyped", "hang", "memory", "crash")


# -- the child ---------------------------------------------------------------------------------
class ChildGone(Exception):
    """The child closed its end of the pipe: it died (crash, abort, killed by the system)."""


class Child:
    """One fuzz_worker process; ``run`` returns its result dict, or a hang/crash description."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.dump = tempfile.NamedTemporaryFile(prefix="candle-web-fuzz-", suffix=".dump")
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", CANDLE_WEB_OFFLINE="1",
                   PYTHONFAULTHANDLER="1")
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(memory_bytes), self.dump.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.cases = 0
        try:
            ready = self._receive(time.monotonic() + CHILD_START_SECONDS)
        except ChildGone:
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise RuntimeError(f"the fuzz worker did not start:\n{self._stderr_tail()}")

    def _read_exact(self, size: int, deadline: float) -> bytes | None:
        """``size`` bytes from the child's pipe, None on timeout; ChildGone at end of file."""
        fd = self.process.stdout.fileno()
        chunks, left = [], size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, left)
            if not chunk:
                raise ChildGone()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _receive(self, deadline: float):
        header = self._read_exact(LENGTH.size, deadline)
        if header is None:
            return None
        body = self._read_exact(LENGTH.unpack(header)[0], deadline)
        return None if body is None else pickle.loads(body)

    def _stderr_tail(self, size: int = 3000) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-size:]

    def _dumped_stack(self) -> tuple[str, str]:
        """(code site, stack text) from faulthandler's dump of the hung or crashed child."""
        text = Path(self.dump.name).read_text(errors="replace")
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text)
        # faulthandler lists the innermost frame first; choose_site wants it last.
        chosen = choose_site([(name, int(line), function) for name, line, function
                              in reversed(frames)])
        return relative_site(*chosen), text

    def run(self, target: str, data: bytes, timeout: float) -> dict:
        self.cases += 1
        try:
            payload = pickle.dumps((target, data, timeout))
            self.process.stdin.write(LENGTH.pack(len(payload)) + payload)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the child died; reported below like any crash
        try:
            result = self._receive(time.monotonic() + timeout)
        except ChildGone:
            return self._crash()
        if result is not None:
            return result
        self.kill()
        site, stack = self._dumped_stack()
        return {"outcome": "hang", "type": f"no result within {timeout:g} s", "message": "",
                "site": site, "traceback": stack}

    def _crash(self) -> dict:
        self.process.wait()
        site, stack = self._dumped_stack()
        last_lines = self._stderr_tail(500).strip().splitlines()
        return {"outcome": "crash", "type": f"exit status {self.process.returncode}",
                "message": last_lines[-1] if last_lines else "", "site": site,
                "traceback": stack + "\n" + self._stderr_tail()}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.kill()
        self.dump.close()
        self.stderr.close()


class ChildPool:
    """Keeps one child alive, replacing it after a hang, crash or memory finding (its state
    is no longer trustworthy) and every CASES_PER_CHILD cases."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.child = None

    def run(self, target: str, data: bytes, timeout: float) -> dict:
        if self.child is None or self.child.cases >= CASES_PER_CHILD:
            self.close()
            self.child = Child(self.memory_bytes)
        result = self.child.run(target, data, timeout)
        if result["outcome"] in ("hang", "crash", "memory"):
            self.close()
        return result

    def close(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None


# -- findings ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Group:
    """Every case that failed the same way at the same place."""

    kind: str
    type: str
    site: str
    message: str
    count: int = 0
    saved: list = dataclasses.field(default_factory=list)

    @property
    def key(self) -> tuple:
        return group_key(self.kind, self.type, self.site)


def group_key(kind: str, type_name: str, site: str) -> tuple:
    """Line numbers are left out: the parsers are being edited while findings are compared."""
    return kind, type_name, re.sub(r":\d+ in ", " in ", site)


@dataclasses.dataclass
class TargetReport:
    target: str
    about: str
    seeds: list
    cases: int = 0
    seconds: float = 0.0
    groups: dict = dataclasses.field(default_factory=dict)
    # How the passing cases passed: "ok" (the parser accepted the input) or "typed" (it
    # raised a CandleError). Mostly "typed" with no "ok" would mean the seeds never get far.
    passed: dict = dataclasses.field(default_factory=lambda: {"ok": 0, "typed": 0})
    note: str = ""

    def count(self, kind: str) -> int:
        return sum(g.count for g in self.groups.values() if g.kind == kind)

    @property
    def failed(self) -> bool:
        return bool(self.groups) or not self.seeds


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60]


def replay_command(target: str, path: Path) -> str:
    try:
        shown = path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        shown = path
    python = ".venv/bin/python" if (REPO_ROOT / ".venv").exists() else "python"
    return f"{python} tests/fuzz/harness.py --replay {target} {shown}"


def save_finding(folder: Path, target: str, result: dict, data: bytes, seed_name: str,
                 case: int, run_seed: int) -> Path:
    """The input as <kind>-<type>-<site>-<hash>.bin and a .txt note beside it."""
    folder = folder / _slug(target)
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(data).hexdigest()[:12]
    stem = _slug(f"{result['outcome']}-{result['type']}-{result['site']}") + f"-{digest}"
    path = folder / f"{stem}.bin"
    path.write_bytes(data)
    note = (f"target: {target}\nkind: {result['outcome']}\ntype: {result['type']}\n"
            f"site: {result['site']}\nmessage: {result['message']}\nseed: {seed_name}\n"
            f"case: {case} of run seed {run_seed}\nreplay: {replay_command(target, path)}\n\n"
            f"{result.get('traceback', '')}")
    path.with_suffix(".txt").write_text(note)
    return path


# -- running -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Settings:
    seconds: float | None = None  # per target; None: stop by cases only
    cases: int | None = None  # per target
    run_seed: int = 0
    case_seconds: float = DEFAULT_CASE_SECONDS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    findings: Path = DEFAULT_FINDINGS


_seed_cache: dict = {}


def seeds_for(target) -> list:
    """The target's seeds, built once per run (the config targets share theirs)."""
    if target.seeds not in _seed_cache:
        _seed_cache[target.seeds] = seeds_testlib.SEED_BUILDERS[target.seeds]()
    seeds = _seed_cache[target.seeds]
    if target.kind:
        seeds = [dataclasses.replace(s, weight=s.weight if s.kind == target.kind
                                     else s.weight * OTHER_KIND_WEIGHT) for s in seeds]
    return seeds


def fuzz_target(target, seeds: list, settings: Settings, pool: ChildPool) -> TargetReport:
    report = TargetReport(target.name, target.about, [s.name for s in seeds])
    if target.kind and not any(s.kind == target.kind for s in seeds):
        report.note = (f"no real {target.kind} config.json in the cache: fuzzed from the other "
                       f"models' configs")
    if not seeds:
        return report
    start = time.monotonic()
    while settings.cases is None or report.cases < settings.cases:
        if settings.seconds is not None and time.monotonic() - start >= settings.seconds:
            break
        seed_name, data = mutate(case_rng(settings.run_seed, target.name, report.cases), seeds)
        result = pool.run(target.name, data, settings.case_seconds)
        if result["outcome"] in FINDING_KINDS:
            record(report, result, data, seed_name, settings)
        else:
            report.passed[result["outcome"]] += 1
        report.cases += 1
    report.seconds = time.monotonic() - start
    return report


def record(report: TargetReport, result: dict, data: bytes, seed_name: str,
           settings: Settings) -> None:
    key = group_key(result["outcome"], result["type"], result["site"])
    group = report.groups.get(key)
    if group is None:
        group = report.groups[key] = Group(result["outcome"], result["type"], result["site"],
                                           result["message"])
    group.count += 1
    if len(group.saved) < MAX_SAVED_PER_GROUP:
        group.saved.append(save_finding(settings.findings, report.target, result, data,
                                        seed_name, report.cases, settings.run_seed))


def run_targets(names: list, settings: Settings, out=None) -> list:
    out = out or sys.stdout
    pool = ChildPool(settings.memory_bytes)
    reports = []
    try:
        for name in names:
            target = targets_testlib.find(name)
            started = time.monotonic()
            seeds = seeds_for(target) if target.seeds else broken_target_seeds()
            print(f"== {name}: {target.about} ({len(seeds)} seeds, built in "
                  f"{time.monotonic() - started:.1f} s)", file=out, flush=True)
            report = fuzz_target(target, seeds, settings, pool)
            print_report(report, out)
            reports.append(report)
    finally:
        pool.close()
    return reports


def broken_target_seeds() -> list:
    """Inputs for the deliberately broken targets: any bytes will do."""
    from tests.fuzz.mutators_testlib import Seed

    return [Seed("odd first byte", b"\x01fuzz"), Seed("even first byte", b"\x02fuzz")]


# -- reporting ---------------------------------------------------------------------------------
def print_report(report: TargetReport, out=None) -> None:
    out = out or sys.stdout
    if not report.seeds:
        missing = ", ".join(sorted(seeds_testlib.missing)) or "?"
        print(f"   NO SEEDS: the model cache lacks {missing}; run `make models`", file=out)
        return
    rate = report.cases / report.seconds if report.seconds else 0.0
    print(f"   {report.cases} cases in {report.seconds:.1f} s ({rate:.0f}/s): "
          f"untyped exceptions {report.count('untyped')}, hangs {report.count('hang')}, "
          f"memory {report.count('memory')}, crashes {report.count('crash')}; passed: "
          f"{report.passed['ok']} accepted, {report.passed['typed']} CandleError", file=out)
    if report.note:
        print(f"   note: {report.note}", file=out)
    for group in sorted(report.groups.values(), key=lambda g: (-g.count, g.key)):
        print(f"   {group.kind:8} {group.type} at {group.site}: {group.count} cases", file=out)
        if group.message:
            print(f"            {group.message[:200]!r}", file=out)
        if group.saved:
            print(f"            replay: {replay_command(report.target, group.saved[0])}",
                  file=out)
    out.flush()


def print_summary(reports: list, out=None) -> None:
    out = out or sys.stdout
    print("\n== summary (cases, untyped, hangs, memory, crashes)", file=out)
    for r in reports:
        status = "NO SEEDS" if not r.seeds else ("FOUND" if r.groups else "ok")
        print(f"   {r.target:20} {r.cases:7} {r.count('untyped'):6} {r.count('hang'):5} "
              f"{r.count('memory'):6} {r.count('crash'):7}   {status}", file=out)


# -- replay ------------------------------------------------------------------------------------
def replay(target_name: str, path: Path, memory_bytes: int) -> int:
    """Run one saved input in a child process under the same cap and show what happens; the
    exit status is 1 when it still fails. A child, because the address-space cap cannot be
    lifted again: set in a test process it broke every test after it."""
    command = [sys.executable, str(Path(__file__).resolve()), "--replay-here", target_name,
               str(path), "--memory-mib", str(memory_bytes >> 20)]
    return subprocess.run(command, check=False).returncode


def _replay_here(target_name: str, path: Path, memory_bytes: int) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    target = targets_testlib.find(target_name)
    data = Path(path).read_bytes()
    print(f"replaying {path} ({len(data)} bytes) on {target_name}; Ctrl-C stops a hang")
    result = run_case(target.run, data)
    if result["outcome"] in ("ok", "typed"):
        print(f"passes: {result['outcome']}")
        return 0
    print(result["traceback"])
    print(f"{result['outcome']}: {result['type']} at {result['site']}")
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, help="fuzzing time per target")
    parser.add_argument("--cases", type=int, help="cases per target")
    parser.add_argument("--targets", help="comma-separated target names (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    parser.add_argument("--case-seconds", type=float, default=DEFAULT_CASE_SECONDS,
                        help="per-case limit: a case running longer is a hang")
    parser.add_argument("--memory-mib", type=int, default=DEFAULT_MEMORY_BYTES >> 20,
                        help="address-space cap of the child")
    parser.add_argument("--findings", type=Path, default=DEFAULT_FINDINGS)
    parser.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"))
    parser.add_argument("--replay-here", nargs=2, help=argparse.SUPPRESS)  # replay's child
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args(argv)
    if args.list:
        for target in targets_testlib.TARGETS.values():
            print(f"{target.name:20} {target.about}")
        return 0
    if args.replay:
        return replay(args.replay[0], Path(args.replay[1]), args.memory_mib << 20)
    if args.replay_here:
        return _replay_here(args.replay_here[0], Path(args.replay_here[1]), args.memory_mib << 20)
    if args.seconds is None and args.cases is None:
        args.seconds = 60.0
    names = args.targets.split(",") if args.targets else list(targets_testlib.TARGETS)
    settings = Settings(args.seconds, args.cases, args.seed, args.case_seconds,
                        args.memory_mib << 20, args.findings)
    print(f"fuzzing {len(names)} targets, "
          + (f"{args.seconds:g} s each" if args.seconds else f"{args.cases} cases each")
          + f", run seed {args.seed}, {args.case_seconds:g} s and {args.memory_mib} MiB per "
          f"case; findings saved under {args.findings}", flush=True)
    reports = run_targets(names, settings)
    print_summary(reports)
    return 1 if any(r.failed for r in reports) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc(limit=0)
        sys.exit(130)
