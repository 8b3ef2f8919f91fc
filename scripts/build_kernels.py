"""Build the browser's WebAssembly SIMD kernels: web/kernels/*.c -> web/vendor/kernels.wasm
(relaxed SIMD: FMA), web/vendor/kernels-simd128.wasm (plain SIMD, for engines without
relaxed SIMD) and web/vendor/kernels-threads.wasm (relaxed SIMD on a shared memory: the
two-thread decode steps, team.h), with `zig cc` from the pinned PyPI package `ziglang`
(dev extra).

First it writes what the ABI table (pkg/candle_web/backend/wasm/abi.py) gives C and JS
(scripts/abi_codegen.py): web/vendor/kernels_abi.h, which the sources include (constants,
the exports' prototypes, the threads build's layouts), and web/vendor/abi.js, which the page's
worker imports.

Cached: a module is rebuilt only when the sha256 of the sources, the generated header, the
flags (the exports are among them) and the zig version differs from the one recorded beside it
(web/vendor/kernels.stamp.json): a change of the table that reaches the C side rebuilds.
Every module, built or cached, is then checked (scripts/wasm_check.py): memory imported as env.memory and nothing
else imported, exports exactly the ABI (pkg/candle_web/backend/wasm/abi.py) with its
signatures, no data segment, and no code touching __stack_pointer; the threads build's memory
import must be shared, the others' must not. A failed check exits 1.

    python scripts/build_kernels.py            # build what changed, check all three
    python scripts/build_kernels.py --force    # rebuild all three
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import abi_codegen  # noqa: E402  (the sibling modules)
import wasm_check  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO_ROOT / "web" / "kernels"
OUT_DIR = REPO_ROOT / "web" / "vendor"
STAMP = "kernels.stamp.json"

COMMON_FLAGS = [
    "--target=wasm32-freestanding", "-O3", "-msimd128", "-nostdlib",
    # No libc calls behind our back (a loop turned into memset would be an import), and no
    # contraction of a * b + c into FMA: dequantization must round as the numpy reference.
    "-fno-builtin", "-ffp-contract=off", "-g0",
    "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function",
    "-Wl,--no-entry", "-Wl,--import-memory",
]
# name -> (flags, the ABI table of its exports, whether its memory is shared)
THREADS_FLAGS = ["-matomics", "-mbulk-memory", "-DKERNELS_THREADS", "-Wl,--shared-memory",
                 # the most a shared memory may grow to (the engine reserves it up front)
                 f"-Wl,--max-memory={wasm_check.load_abi().TEAM_MAX_BYTES}"]
BUILDS = {
    "kernels.wasm": (["-mrelaxed-simd", "-DKERNELS_RELAXED"], "EXPORTS", False),
    "kernels-simd128.wasm": ([], "EXPORTS", False),
    "kernels-threads.wasm": (["-mrelaxed-simd", "-DKERNELS_RELAXED"] + THREADS_FLAGS,
                             "TEAM_EXPORTS", True),
}


def zig_command() -> list[str]:
    return [sys.executable, "-m", "ziglang"]


def zig_version() -> str:
    try:
        done = subprocess.run(zig_command() + ["version"], capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"build_kernels: cannot run zig ({exc}); install the dev extra "
                 "(`make setup`, which pip-installs the pinned ziglang package)")
    return done.stdout.strip()


def sources() -> list[Path]:
    files = sorted(SOURCE_DIR.glob("*.c")) + sorted(SOURCE_DIR.glob("*.h"))
    if not any(f.suffix == ".c" for f in files):
        sys.exit(f"build_kernels: no C sources in {SOURCE_DIR}")
    return files


def build_flags(name: str, exports) -> list[str]:
    return COMMON_FLAGS + BUILDS[name][0] + [f"-Wl,--export={e.name}" for e in exports]


def digest(files, flags, version) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update("\0".join(flags).encode() + b"\0" + version.encode())
    return h.hexdigest()


def compile_module(name: str, flags, files, out: Path, generated_dir: Path) -> str | None:
    """Compile to `out` (the generated header from `generated_dir`); the compiler's message
    on failure."""
    c_files = [str(f) for f in files if f.suffix == ".c"]
    cmd = zig_command() + ["cc"] + flags + ["-I", str(SOURCE_DIR), "-I", str(generated_dir),
                                            "-o", str(out)] + c_files
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return done.stderr or done.stdout or f"zig cc exited with {done.returncode}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)

    abi = wasm_check.load_abi()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    header, _ = abi_codegen.write(abi, args.out_dir)  # before zig: the page needs abi.js anyway
    files = sources() + [header]
    version = zig_version()
    stamp_path = args.out_dir / STAMP
    try:
        stamps = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        stamps = {}

    # The stale modules compile side by side (zig is one process per module, ~12 s each: run
    # one after another they were half a minute of every fresh `make web`), then each is
    # checked and reported in order.
    compiling = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for name, (_, table, _) in BUILDS.items():
            flags = build_flags(name, getattr(abi, table))
            out = args.out_dir / name
            if args.force or not out.exists() or stamps.get(name) != digest(files, flags, version):
                compiling[name] = (time.perf_counter(), pool.submit(
                    compile_module, name, flags, files, out.with_suffix(".tmp.wasm"),
                    args.out_dir))

    failed = False
    for name, (_, table, shared) in BUILDS.items():
        exports = getattr(abi, table)
        signatures = wasm_check.expected_signatures(exports)
        out = args.out_dir / name
        flags = build_flags(name, exports)
        key = digest(files, flags, version)
        if name not in compiling:
            action = "up to date"
        else:
            start, compiled = compiling[name]
            tmp = out.with_suffix(".tmp.wasm")
            error = compiled.result()
            problems = [] if error else wasm_check.check_kernel_module(
                tmp.read_bytes(), signatures, shared_memory=shared)
            if error or problems:
                # A stale module must not stand in for sources that do not build.
                for path in (tmp, out):
                    path.unlink(missing_ok=True)
                stamps.pop(name, None)
                if error:
                    print(f"build_kernels: zig cc FAILED for {name}:\n{error}", file=sys.stderr)
                else:
                    print(f"build_kernels: {name} FAILED the module check:", file=sys.stderr)
                    for p in problems:
                        print(f"  - {p}", file=sys.stderr)
                failed = True
                continue
            tmp.replace(out)
            stamps[name] = key
            action = f"built with zig {version} in {time.perf_counter() - start:.1f} s"
        data = out.read_bytes()
        problems = wasm_check.check_kernel_module(data, signatures, shared_memory=shared)
        if problems:
            print(f"build_kernels: {out} FAILED the module check:", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
            failed = True
            continue
        print(f"build_kernels: {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}"
              f": {action}; checked ({wasm_check.summary(data)})")
    stamp_path.write_text(json.dumps(stamps, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
