"""The generated browser payload: the candle_web wheel and the Pyodide vendoring checks."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"candle_web_script_{name}",
                                                  REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    return module


build_wheel = load_script("build_wheel")
vendor_pyodide = load_script("vendor_pyodide")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    manifest = build_wheel.build_wheel(out)
    return out, manifest


def test_wheel_is_pure_and_holds_only_candle_web(built):
    out, manifest = built
    assert manifest["wheel"].endswith("-py3-none-any.whl")
    with zipfile.ZipFile(out / manifest["wheel"]) as wheel:
        names = wheel.namelist()
        dist_info = f"candle_web-{manifest['version']}.dist-info/"
        assert all(name.startswith(("candle_web/", dist_info)) for name in names), names
        assert not any("__pycache__" in name or name.endswith((".pyc", ".so")) for name in names)
        assert "candle_web/__init__.py" in names and "candle_web/serve/__init__.py" in names
        metadata = wheel.read(dist_info + "METADATA").decode()
        assert "Name: candle-web" in metadata
        assert f"Version: {manifest['version']}" in metadata
        assert "Tag: py3-none-any" in wheel.read(dist_info + "WHEEL").decode()
        source_files = sorted(p.relative_to(REPO_ROOT / "pkg").as_posix()
                              for p in (REPO_ROOT / "pkg" / "candle_web").rglob("*")
                              if p.is_file() and "__pycache__" not in p.parts
                              and p.suffix != ".pyc")
        assert sorted(n for n in names if n.startswith("candle_web/")) == source_files


def test_wheel_carries_the_worker_sessions(built):
    """web/worker.js imports candle_web.worker from the installed wheel (no loose modules)."""
    out, manifest = built
    with zipfile.ZipFile(out / manifest["wheel"]) as wheel:
        names = set(wheel.namelist())
    worker_dir = REPO_ROOT / "pkg" / "candle_web" / "worker"
    sources = sorted(path.name for path in worker_dir.glob("*.py"))
    assert {"__init__.py", "session.py", "whisper.py", "llama.py", "bert.py", "t5.py",
            "twin_check.py"} <= set(sources)
    assert {f"candle_web/worker/{name}" for name in sources} <= names
    assert not (REPO_ROOT / "web" / "py").exists()


def test_wheel_record_hashes_every_file(built):
    out, manifest = built
    with zipfile.ZipFile(out / manifest["wheel"]) as wheel:
        record_name = f"candle_web-{manifest['version']}.dist-info/RECORD"
        rows = [line.split(",") for line in wheel.read(record_name).decode().splitlines()]
        recorded = {name: (digest, size) for name, digest, size in rows}
        assert set(recorded) == set(wheel.namelist())
        for name in wheel.namelist():
            if name == record_name:
                assert recorded[name] == ("", "")
                continue
            data = wheel.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert recorded[name] == ("sha256=" + digest.decode(), str(len(data))), name


def test_wheel_is_reproducible_and_manifest_matches(built, tmp_path):
    out, manifest = built
    again = build_wheel.build_wheel(tmp_path)
    assert again == manifest
    assert (tmp_path / manifest["wheel"]).read_bytes() == (out / manifest["wheel"]).read_bytes()
    data = (out / manifest["wheel"]).read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["size"] == len(data)
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_wheel_imports_from_the_archive(built, tmp_path):
    """The wheel alone (no pkg/ on the path) provides a working candle_web."""
    out, manifest = built
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import candle_web, numpy as np; "
            "assert candle_web.__file__.startswith(sys.argv[1]), candle_web.__file__; "
            "t = candle_web.Tensor.from_numpy(np.eye(2, dtype=np.float32)); "
            "print(candle_web.__version__, t.matmul(t).to_numpy().sum())")
    result = subprocess.run([sys.executable, "-I", "-c", code, str(out / manifest["wheel"])],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [manifest["version"], "2.0"]


def test_hash_mismatch_names_file_and_both_hashes(tmp_path):
    target = tmp_path / "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"
    target.write_bytes(b"not the real wheel")
    actual = hashlib.sha256(b"not the real wheel").hexdigest()
    expected = "0" * 64
    with pytest.raises(vendor_pyodide.VendorError) as caught:
        vendor_pyodide.check_hash(target, expected, "the test")
    message = str(caught.value)
    assert target.name in message and expected in message and actual in message
    vendor_pyodide.check_hash(target, actual, "the test")  # the right hash passes


def _lock(version="0.27.7", **overrides) -> dict:
    packages = {}
    for name, package_version in vendor_pyodide.WANTED_PACKAGES.items():
        packages[name] = {"name": name, "version": package_version,
                          "file_name": f"{name}-{package_version}.whl",
                          "sha256": hashlib.sha256(name.encode()).hexdigest()}
    packages["pandas"] = {"name": "pandas", "version": "2.2.3", "file_name": "pandas.whl",
                          "sha256": "f" * 64}
    for name, package_version in overrides.items():
        packages[name]["version"] = package_version
    return {"info": {"version": version}, "packages": packages}


def test_wanted_wheels_come_from_the_lock(tmp_path):
    lock_path = tmp_path / "pyodide-lock.json"
    lock_path.write_text(json.dumps(_lock()))
    wheels = vendor_pyodide.wanted_wheels(lock_path)
    assert sorted(wheels) == sorted(f"{name}-{version}.whl" for name, version
                                    in vendor_pyodide.WANTED_PACKAGES.items())
    assert wheels["numpy-2.0.2.whl"] == hashlib.sha256(b"numpy").hexdigest()


@pytest.mark.parametrize("lock, fragment", [
    (_lock(version="0.26.0"), "Pyodide 0.26.0"),
    (_lock(numpy="1.26.4"), "numpy 1.26.4"),
])
def test_unexpected_lock_is_refused(tmp_path, lock, fragment):
    lock_path = tmp_path / "pyodide-lock.json"
    lock_path.write_text(json.dumps(lock))
    with pytest.raises(vendor_pyodide.VendorError, match=fragment):
        vendor_pyodide.wanted_wheels(lock_path)


def test_package_json_pins_pyodide_exactly():
    package = json.loads((REPO_ROOT / "package.json").read_text())
    assert package["dependencies"]["pyodide"] == vendor_pyodide.PYODIDE_VERSION
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/pyodide"]["version"] == vendor_pyodide.PYODIDE_VERSION


def test_web_xgrammar_is_pinned_and_copied_checked(tmp_path):
    """The page's grammar engine: package.json and the lock pin the version the script expects,
    the copy is the npm file itself (sha256), its wasm is inside it (a data: URL, so nothing is
    fetched from elsewhere), and a changed file is refused naming both hashes."""
    name = f"node_modules/{vendor_pyodide.XGRAMMAR_NPM_NAME}"
    package = json.loads((REPO_ROOT / "package.json").read_text())
    assert package["dependencies"][vendor_pyodide.XGRAMMAR_NPM_NAME] == \
        vendor_pyodide.XGRAMMAR_VERSION
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())
    assert lock["packages"][name]["version"] == vendor_pyodide.XGRAMMAR_VERSION
    target = tmp_path / "xgrammar" / "web-xgrammar.js"
    assert vendor_pyodide.vendor_xgrammar(target=target) is True
    body = target.read_bytes()
    assert hashlib.sha256(body).hexdigest() == vendor_pyodide.XGRAMMAR_FILE_SHA256
    assert b"data:application/octet-stream;base64," in body
    assert vendor_pyodide.vendor_xgrammar(target=target) is False  # in place: left alone
    changed = tmp_path / "lib" / "index.js"
    changed.parent.mkdir()
    changed.write_bytes(body + b"\n// changed\n")
    (tmp_path / "package.json").write_text(json.dumps({"version": vendor_pyodide.XGRAMMAR_VERSION}))
    with pytest.raises(vendor_pyodide.VendorError) as caught:
        vendor_pyodide.vendor_xgrammar(source=changed, target=tmp_path / "other.js")
    assert vendor_pyodide.XGRAMMAR_FILE_SHA256 in str(caught.value)
    assert hashlib.sha256(changed.read_bytes()).hexdigest() in str(caught.value)
