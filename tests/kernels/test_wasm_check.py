"""The build check of the kernel module (scripts/wasm_check.py) can fail, and says why: a module
that uses the stack, imports more than its memory, has a data segment, or exports something
else than the ABI is refused with a message naming the problem. Fixtures are written in the
WebAssembly text format (wasmtime.wat2wasm) or compiled with zig cc like the real kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import wasm_check  # noqa: E402

wasmtime = pytest.importorskip("wasmtime", reason="wasmtime (dev extra) assembles the fixtures")

# A tiny ABI for the fixtures: one function (i32, f32) -> i32.
SIGNATURES = {"kernel": (("i32", "f32"), ("i32",))}
GOOD_BODY = "(func $kernel (export \"kernel\") (param i32 f32) (result i32) local.get 0)"


def module(*fields: str, memory: str = '(import "env" "memory" (memory 1))') -> bytes:
    return wasmtime.wat2wasm("(module " + memory + " " + " ".join(fields) + ")")


def problems(data: bytes) -> list[str]:
    return wasm_check.check_kernel_module(data, SIGNATURES)


def test_a_clean_module_passes():
    assert problems(module(GOOD_BODY)) == []


def test_stack_pointer_use_is_refused():
    data = module(
        "(global $__stack_pointer (mut i32) (i32.const 65536))",
        "(func $kernel (export \"kernel\") (param i32 f32) (result i32)"
        " global.get $__stack_pointer i32.const 16 i32.sub global.set $__stack_pointer"
        " local.get 0)")
    found = problems(data)
    assert any("kernel: 1 x global.get of __stack_pointer" in p for p in found), found
    assert any("global.set of __stack_pointer" in p and "uses the stack" in p for p in found), found


def test_stack_pointer_found_after_every_kind_of_simd_immediate():
    """The decoder must get every immediate's length right, or it would lose its place and
    miss what follows: v128.const, shuffles, lane indices, memargs, lane loads, relaxed ops."""
    simd = " ".join([
        "i32.const 0 v128.load offset=16 align=4",
        "v128.const i32x4 1 2 3 4 i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
        "f32x4.extract_lane 3 drop",
        "i32.const 0 i32.const 0 v128.load32_splat v128.load8_lane 7 drop",
        "i32.const 0 v128.load64_zero v128.const f32x4 1 2 3 4 v128.const f32x4 1 2 3 4",
        "f32x4.relaxed_madd f32x4.replace_lane 1 drop",
        "i32.const 0 i32.const 0 v128.load v128.store64_lane offset=8 1",
        "i32.const 0 i32.const 0 i32.const 4 memory.fill",
        "f32.const 1.5 i32.trunc_sat_f32_s drop",
        "block $b loop $l i32.const 1 br_if $b i32.const 0 br_table $b $l $b end end",
    ])
    data = module(
        "(global $__stack_pointer (mut i32) (i32.const 65536))",
        f"(func $kernel (export \"kernel\") (param i32 f32) (result i32) {simd}"
        " global.get $__stack_pointer drop local.get 0)")
    found = problems(data)
    assert any("global.get of __stack_pointer" in p for p in found), found
    body = wasm_check.parse_module(data).functions[0].body
    assert body[-1].opcode == 0x0B and body[-2].opcode == 0x20  # ... local.get 0, end


def test_a_c_kernel_with_a_local_array_is_refused(tmp_path):
    """The real failure: C that indexes a local array puts it on wasm-ld's stack."""
    source = tmp_path / "stacky.c"
    source.write_text(
        "float kernel(int i, float x) { volatile float tmp[64];\n"
        "  for (int j = 0; j < 64; j++) tmp[j] = x * j;\n"
        "  return tmp[i & 63]; }\n")
    out = tmp_path / "stacky.wasm"
    cmd = [sys.executable, "-m", "ziglang", "cc", "--target=wasm32-freestanding", "-O3",
           "-msimd128", "-nostdlib", "-Wl,--no-entry", "-Wl,--import-memory",
           "-Wl,--export=kernel", "-o", str(out), str(source)]
    try:
        subprocess.run(cmd, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"zig cc is not available ({exc})")
    found = wasm_check.check_kernel_module(out.read_bytes(), {"kernel": (("i32", "f32"), ("f32",))})
    assert any("__stack_pointer" in p and "uses the stack" in p for p in found), found


def test_other_imports_are_refused():
    data = module('(import "env" "memset" (func (param i32 i32 i32) (result i32)))', GOOD_BODY)
    found = problems(data)
    assert any("imports other than env.memory: env.memset (func)" in p for p in found), found


def test_memory_must_be_imported_as_env_memory():
    found = problems(module(GOOD_BODY, memory='(memory (export "memory") 1)'))
    assert any("memory must be imported as env.memory" in p for p in found), found
    assert any("exports a memory" in p for p in found), found
    found = problems(module(GOOD_BODY, memory='(import "js" "mem" (memory 1))'))
    assert any("memory must be imported as env.memory" in p for p in found), found


def test_data_segments_are_refused():
    found = problems(module(GOOD_BODY, '(data (i32.const 1024) "\\01\\02")'))
    assert any("1 data segment(s)" in p for p in found), found


def test_exports_must_match_the_abi():
    found = problems(module(GOOD_BODY.replace('"kernel"', '"kernel2"')))
    assert any("exports missing from the ABI list: kernel" in p for p in found), found
    assert any("exports not in the ABI list: kernel2" in p for p in found), found
    found = problems(module("(func $kernel (export \"kernel\") (param i32 i32) (result i32) "
                            "local.get 0)"))
    assert any("export kernel has signature ('i32', 'i32')" in p for p in found), found


def test_undecodable_bytes_are_refused():
    assert problems(b"\0asm\1\0\0\0\x0a\x05\x01\x03\x00\xff\x0b")[0].startswith("cannot decode")
    assert problems(b"not wasm")[0].startswith("cannot decode")


def test_a_shared_memory_is_refused_where_it_must_not_be_and_required_where_it_must():
    """Pyodide's memory is not shared (a shared import would not link with it); the threads
    build's must be (its helper thread works on the same memory)."""
    shared = '(import "env" "memory" (memory 1 16 shared))'
    found = wasm_check.check_kernel_module(module(GOOD_BODY, memory=shared), SIGNATURES)
    assert found == ["the memory import is shared; this build's must not be shared"], found
    found = wasm_check.check_kernel_module(module(GOOD_BODY), SIGNATURES, shared_memory=True)
    assert found == ["the memory import is not shared; this build's must be shared"], found
    assert wasm_check.check_kernel_module(module(GOOD_BODY, memory=shared), SIGNATURES,
                                          shared_memory=True) == []


def test_atomics_are_decoded_and_do_not_hide_what_follows():
    shared = '(import "env" "memory" (memory 1 16 shared))'
    data = module(
        "(global $__stack_pointer (mut i32) (i32.const 65536))",
        "(func $kernel (export \"kernel\") (param i32 f32) (result i32)"
        " i32.const 0 i32.const 1 i32.atomic.rmw.add offset=4 drop"
        " i32.const 0 i32.const 0 i64.const -1 memory.atomic.wait32 drop"
        " i32.const 0 i32.const 1 memory.atomic.notify drop atomic.fence"
        " global.get $__stack_pointer drop local.get 0)", memory=shared)
    found = wasm_check.check_kernel_module(data, SIGNATURES, shared_memory=True)
    assert any("1 x global.get of __stack_pointer" in p for p in found), found


@pytest.mark.parametrize("name", ["kernels.wasm", "kernels-simd128.wasm", "kernels-threads.wasm"])
def test_the_built_modules_pass(name):
    path = REPO_ROOT / "web" / "vendor" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (python scripts/build_kernels.py)")
    data = path.read_bytes()
    threads = name == "kernels-threads.wasm"
    signatures = (wasm_check.expected_signatures(wasm_check.load_abi().TEAM_EXPORTS) if threads
                  else None)
    assert wasm_check.check_kernel_module(data, signatures, shared_memory=threads) == []
    module = wasm_check.parse_module(data)
    relaxed = sum(1 for f in module.functions for i in f.body if i.opcode == 0xFD and i.subop >= 0x100)
    assert (relaxed > 0) == (name != "kernels-simd128.wasm"), f"{name}: {relaxed} relaxed SIMD instructions"
    atomics = sum(1 for f in module.functions for i in f.body if i.opcode == 0xFE)
    assert (atomics > 0) == threads, f"{name}: {atomics} atomic instructions"
