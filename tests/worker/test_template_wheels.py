"""The page's Jinja2 + MarkupSafe (scripts/vendor_pyodide.py, for models' own chat templates):
Jinja2's py3-none-any wheel from PyPI, and a pure py3-none-any MarkupSafe wheel built from its
PyPI sdist, both downloaded by pip against pinned sha256s.

The built MarkupSafe wheel is checked as the page uses it: unpacked with the Jinja2 wheel into
a folder, imported by a fresh interpreter started with -I -S (no site-packages, so the dev
venv's MarkupSafe, which has the C `_speedups`, cannot be picked up), where `_speedups` is
absent and `markupsafe.escape('<a>')` and a Jinja2 autoescaped render still work. Then the
wheel's RECORD, tag and reproducibility, and the refusals: a pin pip cannot match, and an sdist
whose package has no pure-Python fallback.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_vendor_script():
    spec = importlib.util.spec_from_file_location("candle_web_vendor_pyodide_templates",
                                                  REPO_ROOT / "scripts" / "vendor_pyodide.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vendor_pyodide = _load_vendor_script()
MARKUPSAFE_VERSION = vendor_pyodide.TEMPLATE_DOWNLOADS["markupsafe"][0]
JINJA2_VERSION = vendor_pyodide.TEMPLATE_DOWNLOADS["jinja2"][0]


@pytest.fixture(scope="module")
def downloads():
    """name -> the pinned PyPI file (web/vendor/pypi/: pip runs only when one is missing)."""
    return vendor_pyodide.fetch_template_downloads()


@pytest.fixture(scope="module")
def markupsafe_wheel(downloads, tmp_path_factory) -> Path:
    return vendor_pyodide.build_pure_markupsafe_wheel(downloads["markupsafe"],
                                                      tmp_path_factory.mktemp("wheels"))


def test_downloads_have_the_pinned_hashes(downloads):
    for name, (_, file_name, sha256) in vendor_pyodide.TEMPLATE_DOWNLOADS.items():
        assert downloads[name].name == file_name
        assert hashlib.sha256(downloads[name].read_bytes()).hexdigest() == sha256


def test_markupsafe_wheel_is_pure_recorded_and_reproducible(markupsafe_wheel, downloads,
                                                            tmp_path):
    assert markupsafe_wheel.name == f"markupsafe-{MARKUPSAFE_VERSION}-py3-none-any.whl"
    dist_info = f"markupsafe-{MARKUPSAFE_VERSION}.dist-info/"
    with zipfile.ZipFile(markupsafe_wheel) as wheel:
        names = wheel.namelist()
        package = sorted(name for name in names if name.startswith("markupsafe/"))
        assert package == ["markupsafe/__init__.py", "markupsafe/_native.py",
                           "markupsafe/py.typed"]
        assert all(name in package or name.startswith(dist_info) for name in names), names
        assert "Tag: py3-none-any" in wheel.read(dist_info + "WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel.read(dist_info + "WHEEL").decode()
        metadata = wheel.read(dist_info + "METADATA").decode()
        assert "Name: MarkupSafe" in metadata and f"Version: {MARKUPSAFE_VERSION}" in metadata
        record = wheel.read(dist_info + "RECORD").decode().splitlines()
        recorded = {}
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            recorded[name] = (digest, size)
        assert set(recorded) == set(names)
        assert recorded[dist_info + "RECORD"] == ("", "")
        for name in names:
            if name == dist_info + "RECORD":
                continue
            data = wheel.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert recorded[name] == (expected, str(len(data))), name
    again = vendor_pyodide.build_pure_markupsafe_wheel(downloads["markupsafe"], tmp_path)
    assert again.read_bytes() == markupsafe_wheel.read_bytes()


IMPORT_CHECK = """
import importlib.metadata, json, sys
sys.path.insert(0, sys.argv[1])
import markupsafe, jinja2
print(json.dumps({
    "markupsafe_file": markupsafe.__file__,
    "jinja2_file": jinja2.__file__,
    "speedups_loaded": "markupsafe._speedups" in sys.modules,
    "escape": str(markupsafe.escape("<a>")),
    "markup_format": str(markupsafe.Markup("<b>{}</b>").format("<i>")),
    "autoescaped": jinja2.Environment(autoescape=True).from_string("{{ x }}").render(x="<a>"),
    "versions": [importlib.metadata.version("markupsafe"), importlib.metadata.version("jinja2")],
    "site_packages": [p for p in sys.path if "site-packages" in p],
}))
"""


def test_built_markupsafe_imports_without_speedups_and_escapes(markupsafe_wheel, downloads,
                                                               tmp_path):
    site = tmp_path / "site"
    for wheel in (markupsafe_wheel, downloads["jinja2"]):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    assert not list(site.glob("markupsafe/_speedups*"))
    result = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORT_CHECK, str(site)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["site_packages"] == []  # nothing but the unpacked wheels to import from
    assert found["markupsafe_file"] == str(site / "markupsafe" / "__init__.py")
    assert found["jinja2_file"] == str(site / "jinja2" / "__init__.py")
    assert found["speedups_loaded"] is False
    assert found["escape"] == "&lt;a&gt;"
    assert found["markup_format"] == "<b>&lt;i&gt;</b>"
    assert found["autoescaped"] == "&lt;a&gt;"
    assert found["versions"] == [MARKUPSAFE_VERSION, JINJA2_VERSION]


def _sdist(path: Path, init_text: str) -> Path:
    root = f"markupsafe-{MARKUPSAFE_VERSION}/"
    files = {root + "PKG-INFO": f"Metadata-Version: 2.1\nName: MarkupSafe\n"
                                f"Version: {MARKUPSAFE_VERSION}\n",
             root + "src/markupsafe/__init__.py": init_text,
             root + "src/markupsafe/_native.py": "def _escape_inner(s):\n    return s\n",
             root + "src/markupsafe/py.typed": ""}
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_an_sdist_without_the_native_fallback_is_refused(tmp_path):
    needs_c = _sdist(tmp_path / "needs_c.tar.gz", "from ._speedups import _escape_inner\n")
    with pytest.raises(vendor_pyodide.VendorError, match="does not fall back to _native"):
        vendor_pyodide.build_pure_markupsafe_wheel(needs_c, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    falls_back = _sdist(tmp_path / "ok.tar.gz", "try:\n    from ._speedups import _escape_inner\n"
                        "except ImportError:\n    from ._native import _escape_inner\n")
    built = vendor_pyodide.build_pure_markupsafe_wheel(falls_back, tmp_path / "out")
    assert built.is_file()


def test_a_pin_pip_cannot_match_is_refused_and_the_page_falls_back(tmp_path, monkeypatch,
                                                                    capsys):
    version, file_name, sha256 = vendor_pyodide.TEMPLATE_DOWNLOADS["markupsafe"]
    wrong = ("0" if sha256[0] != "0" else "1") + sha256[1:]
    monkeypatch.setattr(vendor_pyodide, "PYPI_CACHE_DIR", tmp_path / "pypi")
    monkeypatch.setitem(vendor_pyodide.TEMPLATE_DOWNLOADS, "markupsafe",
                        (version, file_name, wrong))
    with pytest.raises(vendor_pyodide.VendorError, match=f"markupsafe=={version} "
                                                         f"--hash=sha256:{wrong}") as refused:
        vendor_pyodide.fetch_template_downloads()
    assert "DO NOT MATCH THE HASHES" in str(refused.value)  # pip's own refusal
    assert not (tmp_path / "pypi" / file_name).exists()
    # vendor() goes on: no template wheels in the manifest, and a note saying what the page does
    assert vendor_pyodide.vendor_template_wheels(tmp_path / "wheels") == []
    assert "renders the recognised chat formats" in capsys.readouterr().out
