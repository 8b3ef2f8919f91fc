"""The kernels' ABI generated from its one table (pkg/candle_web/backend/wasm/abi.py) by
scripts/abi_codegen.py, which scripts/build_kernels.py runs before compiling: the C header
and the worker's JS module say what the table says, nothing in web/ keeps a hand copy of what
they define, the compiler refuses a C export whose types differ from the table, and the
build's cache key changes with the table."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import abi_codegen  # noqa: E402
import build_kernels  # noqa: E402
import wasm_check  # noqa: E402

ABI = wasm_check.load_abi()
HEADER = abi_codegen.c_header(ABI)
JS = abi_codegen.js_module(ABI)


def _defines(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (.+)$", text, re.M))


def _js_exports(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export const (\w+) = (.+);$", text, re.M))


def test_the_header_says_what_the_table_says():
    defines = _defines(HEADER)
    assert defines["ABI_VERSION"] == str(ABI.ABI_VERSION)
    for op, code in ABI.UNARY_OPS.items():
        assert defines[f"UNARY_{op.upper()}"] == str(code)
    for block, fields in ABI.TEAM_ARG_BLOCKS.items():
        assert defines[block] == str(len(fields))
        assert [int(defines[f"{block}_{name.upper()}"]) for name, _ in fields] == \
            list(range(len(fields)))
    struct = re.search(r"typedef struct \{(.*?)\} TeamCtrl;", HEADER, re.S).group(1)
    assert tuple(re.findall(r"int32_t (\w+);", struct)) == ABI.TEAM_CTRL_FIELDS
    assert int(defines["TEAM_CTRL_BYTES"]) == 4 * len(ABI.TEAM_CTRL_FIELDS)
    # one prototype per export, its parameters in the table's order
    for export in ABI.EXPORTS:
        declared = re.search(rf"\b{export.name}\((.*?)\);", HEADER, re.S).group(1)
        names = re.findall(r"(\w+)(?:,|$)", declared.replace("\n", " ").strip())
        assert names == ([a.name for a in export.args] or ["void"]), export.name


def test_the_js_module_says_what_the_table_says():
    exports = _js_exports(JS)
    assert exports["ABI_VERSION"] == str(ABI.ABI_VERSION)
    assert exports["KERNELS_JS_MODULE"] == f'"{ABI.KERNELS_JS_MODULE}"'
    assert exports["TEAM_JS_MODULE"] == f'"{ABI.TEAM_JS_MODULE}"'
    assert exports["TEAM_CTRL_OFFSET"] == str(1 << 20)
    assert exports["TEAM_HELPER_SCRATCH_OFFSET"] == str((1 << 20) + 64)
    assert exports["TEAM_MAX_PAGES"] == "32768"  # 2 GiB, the threads build's --max-memory
    slots = re.search(r"Object\.freeze\(\{(.*)\}\)", exports["TEAM_CTRL_SLOTS"]).group(1)
    assert [s.split(":")[0].strip() for s in slots.split(",")] == list(ABI.TEAM_CTRL_FIELDS)
    assert "alive: 4" in slots


def test_no_source_in_web_keeps_a_copy_of_what_is_generated():
    """The C sources define none of the header's names (they include it), and no script of
    the page declares a constant the JS module exports (it imports it)."""
    generated = set(_defines(HEADER)) | {"TeamCtrl"}
    for source in sorted((REPO_ROOT / "web" / "kernels").glob("*.[ch]")):
        text = source.read_text()
        copies = {name for name in re.findall(r"#define (\w+)", text) if name in generated}
        if re.search(r"\}\s*TeamCtrl;", text):
            copies.add("TeamCtrl")
        assert copies == set(), f"{source.name} defines {sorted(copies)} by hand"
    exported = set(_js_exports(JS))
    for script in sorted((REPO_ROOT / "web").rglob("*.js")):
        if "vendor" in script.relative_to(REPO_ROOT / "web").parts:
            continue
        text = script.read_text()
        copies = {name for name in re.findall(r"\bconst (\w+)\s*=", text) if name in exported}
        assert copies == set(), f"{script.relative_to(REPO_ROOT)} declares {sorted(copies)}"


def test_the_built_files_are_the_tables(tmp_path):
    """What a build wrote into web/vendor/ is what the table gives now (a stale web/vendor/
    would show here); writing twice leaves the files alone."""
    vendor = REPO_ROOT / "web" / "vendor"
    built = [vendor / abi_codegen.HEADER_NAME, vendor / abi_codegen.JS_NAME]
    if not all(path.is_file() for path in built):
        pytest.skip("web/vendor is not built (python scripts/build_kernels.py)")
    assert [path.read_text() for path in built] == [HEADER, JS]
    first = abi_codegen.write(ABI, tmp_path)
    stamps = [path.stat().st_mtime_ns for path in first]
    assert [path.stat().st_mtime_ns for path in abi_codegen.write(ABI, tmp_path)] == stamps


class _Table:
    """The ABI module with some attributes replaced."""

    def __init__(self, **changed):
        self.__dict__.update({k: getattr(ABI, k) for k in dir(ABI) if not k.startswith("__")})
        self.__dict__.update(changed)


def test_the_build_cache_follows_the_table(tmp_path):
    version = "0.17.0"
    flags = build_kernels.build_flags("kernels.wasm", ABI.EXPORTS)
    sources = build_kernels.sources()

    def key(table, where):
        header, _ = abi_codegen.write(table, tmp_path / where)
        return build_kernels.digest(sources + [header], flags, version)

    same = key(ABI, "a")
    assert key(ABI, "b") == same
    jobs = dict(ABI.TEAM_JOBS, whisper_encoder=4)
    assert key(_Table(TEAM_JOBS=jobs), "c") != same


def test_the_compiler_refuses_an_export_the_table_types_otherwise(tmp_path):
    """steps.c compiled against a header whose rms_logits_step takes its `x` as f16 bits: the
    C definition (const float *) conflicts with the generated prototype."""
    exports = tuple(
        replace(e, args=tuple(replace(a, dtype="f16") if a.name == "x" else a for a in e.args))
        if e.name == "rms_logits_step" else e for e in ABI.EXPORTS)
    abi_codegen.write(_Table(EXPORTS=exports), tmp_path)
    cmd = [sys.executable, "-m", "ziglang", "cc", "--target=wasm32-freestanding", "-O1",
           "-msimd128", "-nostdlib", "-c", "-o", str(tmp_path / "steps.o"),
           "-I", str(REPO_ROOT / "web" / "kernels"), "-I", str(tmp_path),
           str(REPO_ROOT / "web" / "kernels" / "steps.c")]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"zig cc is not available ({exc})")
    if "No module named ziglang" in done.stderr:
        pytest.skip("zig cc is not available (the dev extra's ziglang)")
    assert done.returncode != 0
    assert "conflicting types for 'rms_logits_step'" in done.stderr, done.stderr[-2000:]
    abi_codegen.write(ABI, tmp_path)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
