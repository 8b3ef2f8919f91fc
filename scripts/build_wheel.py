#!/usr/bin/env python3
"""Build the pure `candle_web` wheel (py3-none-any) that the browser worker installs.

Only pkg/candle_web goes in: the browser never sees native/ (numba/cupy twin). The wheel is
written by hand with zipfile instead of pip/setuptools because that takes ~50 ms, needs no
network or build isolation, and is reproducible: fixed timestamps and sorted entries give the
same bytes for the same sources, so the worker (and HTTP caching) can trust the sha256.

Usage: python scripts/build_wheel.py [--out DIR]   (default DIR: web/vendor/wheels)
Writes DIR/<wheel> and DIR/manifest.json ({"wheel", "version", "sha256", "size", "files",
"kernels"}) and removes older candle_web wheels from DIR. `kernels` lists the wasm kernel builds
found in the kernels folder (web/vendor, made by scripts/build_kernels.py), keyed by variant:
{"relaxed-simd": {"file": "kernels.wasm", "sha256", "size"}, "simd128": {...}}; the worker
fetches them from there, checks the sha256 like the wheel's, and uses the numpy backend when a
build is absent. Paths are relative to the kernels folder. `snapshot` (when one is given): the
Pyodide memory snapshot the worker restores instead of starting Python (scripts/
pyodide_snapshot.mjs), {"file", "sha256", "size"} with its path relative to web/vendor.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO_ROOT / "pkg" / "candle_web"
PYPROJECT = REPO_ROOT / "pyproject.toml"
DEFAULT_OUT_DIR = REPO_ROOT / "web" / "vendor" / "wheels"
MANIFEST_NAME = "manifest.json"
DEFAULT_KERNELS_DIR = REPO_ROOT / "web" / "vendor"
# variant (the worker's name for it, chosen there by feature detection) -> file name
KERNEL_FILES = {"relaxed-simd": "kernels.wasm", "simd128": "kernels-simd128.wasm",
                "threads": "kernels-threads.wasm"}

DISTRIBUTION = "candle-web"
# PEP 427: the file name uses the distribution name with '-' replaced by '_'.
WHEEL_NAME_PREFIX = "candle_web"
WHEEL_TAG = "py3-none-any"
# zipfile cannot store dates before 1980; a fixed date keeps the archive reproducible.
FIXED_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
# Only files the package needs at run time; caches and editor droppings stay out.
SKIPPED_DIR_NAMES = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo", ".so", ".pyd"}


def read_project_metadata(pyproject: Path = PYPROJECT) -> dict:
    """Version, Python requirement and run-time dependencies from pyproject.toml."""
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: fall back to the few fields we need.
        version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
        if version is None:
            raise SystemExit(f"build_wheel: no version in {pyproject}")
        return {"version": version.group(1), "requires_python": ">=3.10",
                "dependencies": ["numpy>=1.24"], "summary": ""}
    project = tomllib.loads(text)["project"]
    return {
        "version": project["version"],
        "requires_python": project.get("requires-python", ""),
        "dependencies": list(project.get("dependencies", [])),
        "summary": project.get("description", ""),
    }


def package_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    files = []
    for path in sorted(package_dir.rglob("*")):
        if not path.is_file():
            continue
        relative_parts = path.relative_to(package_dir).parts
        if any(part in SKIPPED_DIR_NAMES or part.startswith(".") for part in relative_parts):
            continue
        if path.suffix in SKIPPED_SUFFIXES:
            continue
        files.append(path)
    return files


def record_digest(data: bytes) -> str:
    """RECORD hash format: urlsafe base64 sha256 without padding (PEP 376/427)."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def metadata_text(meta: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {DISTRIBUTION}", f"Version: {meta['version']}"]
    if meta["summary"]:
        lines.append(f"Summary: {meta['summary']}")
    if meta["requires_python"]:
        lines.append(f"Requires-Python: {meta['requires_python']}")
    lines += [f"Requires-Dist: {dep}" for dep in meta["dependencies"]]
    return "\n".join(lines) + "\n"


def wheel_text() -> str:
    return ("Wheel-Version: 1.0\nGenerator: candle-web scripts/build_wheel.py\n"
            f"Root-Is-Purelib: true\nTag: {WHEEL_TAG}\n")


def _write_entry(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16  # regular file, rw-r--r--
    archive.writestr(info, data)


def kernel_entries(kernels_dir: Path | None) -> dict:
    """variant -> {file, sha256, size} for each kernel build present in kernels_dir."""
    if kernels_dir is None:
        return {}
    entries = {}
    for variant, name in KERNEL_FILES.items():
        path = kernels_dir / name
        if path.is_file():
            entries[variant] = file_entry(path, kernels_dir)
    return entries


def file_entry(path: Path, relative_to: Path) -> dict:
    data = path.read_bytes()
    return {"file": path.relative_to(relative_to).as_posix(),
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def build_wheel(out_dir: Path = DEFAULT_OUT_DIR, package_dir: Path = PACKAGE_DIR,
                pyproject: Path = PYPROJECT, kernels_dir: Path | None = None,
                snapshot: Path | None = None) -> dict:
    """Build the wheel into out_dir, write the manifest (with the kernel builds found in
    kernels_dir, none when it is None, and the Pyodide snapshot file when given), return the
    manifest dict."""
    meta = read_project_metadata(pyproject)
    version = meta["version"]
    wheel_name = f"{WHEEL_NAME_PREFIX}-{version}-{WHEEL_TAG}.whl"
    dist_info = f"{WHEEL_NAME_PREFIX}-{version}.dist-info"

    entries: list[tuple[str, bytes]] = []
    for path in package_files(package_dir):
        archive_name = "candle_web/" + path.relative_to(package_dir).as_posix()
        entries.append((archive_name, path.read_bytes()))
    if not entries:
        raise SystemExit(f"build_wheel: no files under {package_dir}")
    entries.append((f"{dist_info}/METADATA", metadata_text(meta).encode("utf-8")))
    entries.append((f"{dist_info}/WHEEL", wheel_text().encode("utf-8")))
    entries.append((f"{dist_info}/top_level.txt", b"candle_web\n"))

    record_lines = [f"{name},{record_digest(data)},{len(data)}" for name, data in entries]
    record_lines.append(f"{dist_info}/RECORD,,")
    entries.append((f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode("utf-8")))

    out_dir.mkdir(parents=True, exist_ok=True)
    temp_path = out_dir / (wheel_name + ".tmp")
    with zipfile.ZipFile(temp_path, "w") as archive:
        for name, data in entries:
            _write_entry(archive, name, data)
    wheel_path = out_dir / wheel_name
    if wheel_path.is_file() and wheel_path.read_bytes() == temp_path.read_bytes():
        # Unchanged sources: keep the old file so its mtime (and the server's ETag) stay put.
        temp_path.unlink()
    else:
        temp_path.replace(wheel_path)  # atomic: a server never hands out half a wheel

    for stale in out_dir.glob(f"{WHEEL_NAME_PREFIX}-*.whl"):
        if stale.name != wheel_name:
            stale.unlink()

    wheel_bytes = wheel_path.read_bytes()
    manifest = {
        "wheel": wheel_name,
        "version": version,
        "sha256": hashlib.sha256(wheel_bytes).hexdigest(),
        "size": len(wheel_bytes),
        "files": len(entries) - 4,  # package files, without the dist-info entries
        "kernels": kernel_entries(kernels_dir),
    }
    if snapshot is not None:
        manifest["snapshot"] = file_entry(snapshot, DEFAULT_KERNELS_DIR)
    manifest_path = out_dir / MANIFEST_NAME
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR,
                        help="output folder (default: web/vendor/wheels)")
    parser.add_argument("--kernels", type=Path, default=DEFAULT_KERNELS_DIR,
                        help="folder of the wasm kernel builds (default: web/vendor)")
    args = parser.parse_args(argv)
    manifest = build_wheel(args.out, kernels_dir=args.kernels)
    print(f"built {args.out / manifest['wheel']} ({manifest['files']} files, "
          f"{manifest['size']} bytes, sha256 {manifest['sha256'][:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
