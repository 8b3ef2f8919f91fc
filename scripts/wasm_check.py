"""A small WebAssembly binary reader, and the checks the kernel module must pass.

Why our own reader: the kernels run on Pyodide's own memory, so a module that ever touched the
`__stack_pointer` global (wasm-ld defines one even when the memory is imported, at 64 KiB or
1 MiB: inside Pyodide's heap) would silently corrupt it. Only decoding every instruction of
every function body proves that no code reads or writes it. The reader knows the immediates of
the MVP opcodes and of the 0xFC (saturating truncation, bulk memory), 0xFD (SIMD and relaxed
SIMD) and 0xFE (threads) prefixes; an opcode it does not know is an error, never skipped.

    python scripts/wasm_check.py web/vendor/kernels.wasm     # prints the summary and problems
"""

from __future__ import annotations

import argparse
import importlib.util
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ABI_FILE = REPO_ROOT / "pkg" / "candle_web" / "backend" / "wasm" / "abi.py"

WASM_MAGIC = b"\0asm"
WASM_VERSION = 1

SECTION_NAMES = {0: "custom", 1: "type", 2: "import", 3: "function", 4: "table", 5: "memory",
                 6: "global", 7: "export", 8: "start", 9: "element", 10: "code", 11: "data",
                 12: "datacount", 13: "tag"}
VALTYPES = {0x7F: "i32", 0x7E: "i64", 0x7D: "f32", 0x7C: "f64", 0x7B: "v128", 0x70: "funcref",
            0x6F: "externref"}
EXTERNAL_KINDS = {0: "func", 1: "table", 2: "memory", 3: "global", 4: "tag"}

# Exports wasm-ld adds on its own to a `--no-entry --import-memory` module. None were seen
# with zig 0.17 (memory is imported, so it is not exported; the threads build's one function
# table, for the job table's pointer in web/kernels/team_jobs.c, is the module's own: neither
# imported nor exported, which the import and export checks below hold it to). Listed here so
# that any future forced export is a conscious decision, not a silent one.
LINKER_FORCED_EXPORTS: frozenset[str] = frozenset()
STACK_POINTER = "__stack_pointer"


class WasmFormatError(ValueError):
    """The bytes are not a module this reader can decode."""


# -- decoding ------------------------------------------------------------------------------------

class Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def at_end(self) -> bool:
        return self.pos >= self.end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise WasmFormatError(f"unexpected end of data at byte {self.pos}")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def bytes(self, n: int) -> bytes:
        if self.pos + n > self.end:
            raise WasmFormatError(f"unexpected end of data reading {n} bytes at {self.pos}")
        value = self.data[self.pos:self.pos + n]
        self.pos += n
        return value

    def u32(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result
            if shift > 35:
                raise WasmFormatError(f"LEB128 u32 too long at byte {self.pos}")

    def sleb(self, bits: int) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if b & 0x40:
                    result -= 1 << shift
                return result
            if shift > bits + 7:
                raise WasmFormatError(f"LEB128 s{bits} too long at byte {self.pos}")

    def name(self) -> str:
        return self.bytes(self.u32()).decode("utf-8")

    def valtype(self) -> str:
        code = self.byte()
        if code not in VALTYPES:
            raise WasmFormatError(f"unknown value type 0x{code:02x} at byte {self.pos - 1}")
        return VALTYPES[code]

    def limits(self) -> tuple[int, int | None]:
        flags = self.byte()
        minimum = self.u32()
        maximum = self.u32() if flags & 1 else None
        return minimum, maximum


@dataclass
class Instruction:
    offset: int  # byte offset in the module
    opcode: int  # the first byte
    subop: int | None = None  # for the 0xFC/0xFD/0xFE prefixes
    immediate: object = None


@dataclass
class Function:
    index: int  # in the function index space (imports first)
    type_index: int
    name: str = ""
    locals: list = field(default_factory=list)
    body: list = field(default_factory=list)  # Instructions


@dataclass
class Module:
    types: list = field(default_factory=list)  # (params tuple, results tuple)
    imports: list = field(default_factory=list)  # (module, name, kind, descriptor)
    functions: list = field(default_factory=list)  # defined Functions
    globals: list = field(default_factory=list)  # (valtype, mutable) of defined globals
    exports: list = field(default_factory=list)  # (name, kind, index)
    data_segments: int = 0
    data_count: int | None = None
    function_names: dict = field(default_factory=dict)
    global_names: dict = field(default_factory=dict)
    sections: list = field(default_factory=list)  # section names in order

    @property
    def imported_functions(self) -> int:
        return sum(1 for imp in self.imports if imp[2] == "func")

    @property
    def imported_globals(self) -> int:
        return sum(1 for imp in self.imports if imp[2] == "global")

    def function_type(self, func_index: int) -> tuple:
        n_imported = self.imported_functions
        if func_index < n_imported:
            type_index = [imp for imp in self.imports if imp[2] == "func"][func_index][3]
        else:
            type_index = self.functions[func_index - n_imported].type_index
        return self.types[type_index]

    def global_name(self, index: int) -> str:
        return self.global_names.get(index, f"global {index}")


def _blocktype(r: Reader):
    code = r.data[r.pos] if r.pos < r.end else None
    if code == 0x40:
        r.byte()
        return None
    if code in VALTYPES:
        return r.valtype()
    return r.sleb(33)  # a type index


def _memarg(r: Reader):
    align = r.u32()
    memory = r.u32() if align & 0x40 else 0  # multi-memory
    return (align & ~0x40, r.u32(), memory)


# Opcodes without immediates: the MVP numeric range, drop/select, ref.is_null, returns.
_NO_IMMEDIATE = set(range(0x45, 0xC5)) | {0x00, 0x01, 0x05, 0x0B, 0x0F, 0x1A, 0x1B, 0xD1, 0x19}
_U32_IMMEDIATE = {0x0C, 0x0D, 0x10, 0x12, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0xD2,
                  0x08, 0x09, 0x18, 0x07}  # br, br_if, call, return_call, locals/globals, tables
_BLOCKS = {0x02, 0x03, 0x04, 0x06}  # block, loop, if, try
_MEMORY_ACCESS = set(range(0x28, 0x3F))
GLOBAL_GET, GLOBAL_SET = 0x23, 0x24

# The 0xFD (SIMD) sub-opcodes by immediate; relaxed SIMD is 0x100..0x113 (no immediates).
_SIMD_MEMARG = set(range(0, 12)) | {92, 93}
_SIMD_BYTES16 = {12, 13}  # v128.const, i8x16.shuffle
_SIMD_LANE = set(range(21, 35))  # extract_lane / replace_lane
_SIMD_MEMARG_LANE = set(range(84, 92))  # load*_lane / store*_lane
_SIMD_LAST = 0x113
# 0xFC sub-opcodes: 0-7 saturating truncation; bulk memory and table ops after.
_FC_IMMEDIATES = {8: 2, 9: 1, 10: 2, 11: 1, 12: 2, 13: 1, 14: 2, 15: 1, 16: 1, 17: 1}


def _instruction(r: Reader) -> Instruction:
    offset = r.pos
    op = r.byte()
    ins = Instruction(offset, op)
    if op in _NO_IMMEDIATE:
        pass
    elif op in _BLOCKS:
        ins.immediate = _blocktype(r)
    elif op in _U32_IMMEDIATE:
        ins.immediate = r.u32()
    elif op == 0x0E:  # br_table
        targets = [r.u32() for _ in range(r.u32())]
        ins.immediate = (targets, r.u32())
    elif op in (0x11, 0x13):  # call_indirect / return_call_indirect
        ins.immediate = (r.u32(), r.u32())
    elif op == 0x1C:  # select t*
        ins.immediate = [r.valtype() for _ in range(r.u32())]
    elif op in _MEMORY_ACCESS:
        ins.immediate = _memarg(r)
    elif op in (0x3F, 0x40):  # memory.size / memory.grow
        ins.immediate = r.u32()
    elif op == 0x41:
        ins.immediate = r.sleb(32)
    elif op == 0x42:
        ins.immediate = r.sleb(64)
    elif op == 0x43:
        ins.immediate = struct.unpack("<f", r.bytes(4))[0]
    elif op == 0x44:
        ins.immediate = struct.unpack("<d", r.bytes(8))[0]
    elif op == 0xD0:  # ref.null t
        ins.immediate = r.byte()
    elif op == 0xFC:
        sub = ins.subop = r.u32()
        if sub > 17:
            raise WasmFormatError(f"unknown 0xFC sub-opcode {sub} at byte {offset}")
        ins.immediate = tuple(r.u32() for _ in range(_FC_IMMEDIATES.get(sub, 0)))
    elif op == 0xFD:
        sub = ins.subop = r.u32()
        if sub in _SIMD_MEMARG:
            ins.immediate = _memarg(r)
        elif sub in _SIMD_BYTES16:
            ins.immediate = r.bytes(16)
        elif sub in _SIMD_LANE:
            ins.immediate = r.byte()
        elif sub in _SIMD_MEMARG_LANE:
            ins.immediate = (_memarg(r), r.byte())
        elif sub > _SIMD_LAST:
            raise WasmFormatError(f"unknown SIMD sub-opcode 0x{sub:x} at byte {offset}")
    elif op == 0xFE:
        sub = ins.subop = r.u32()
        if sub == 0x03:  # atomic.fence
            ins.immediate = r.byte()
        elif sub <= 0x02 or 0x10 <= sub <= 0x4E:
            ins.immediate = _memarg(r)
        else:
            raise WasmFormatError(f"unknown atomic sub-opcode 0x{sub:x} at byte {offset}")
    else:
        raise WasmFormatError(f"unknown opcode 0x{op:02x} at byte {offset}")
    return ins


def _const_expr(r: Reader) -> list:
    body = []
    while True:
        ins = _instruction(r)
        body.append(ins)
        if ins.opcode == 0x0B:
            return body


def _parse_names(r: Reader, module: Module) -> None:
    while not r.at_end():
        kind = r.byte()
        size = r.u32()
        sub = Reader(r.data, r.pos, r.pos + size)
        if kind in (1, 7):  # function names, global names
            target = module.function_names if kind == 1 else module.global_names
            for _ in range(sub.u32()):
                index = sub.u32()
                target[index] = sub.name()
        r.pos += size


def parse_module(data: bytes) -> Module:
    """Decode a module's sections and every instruction of its code."""
    if data[:4] != WASM_MAGIC:
        raise WasmFormatError("not a WebAssembly module (bad magic)")
    if struct.unpack("<I", data[4:8])[0] != WASM_VERSION:
        raise WasmFormatError("unsupported WebAssembly version")
    module = Module()
    r = Reader(data, 8)
    function_types: list[int] = []
    while not r.at_end():
        section_id = r.byte()
        size = r.u32()
        s = Reader(data, r.pos, r.pos + size)
        r.pos += size
        module.sections.append(SECTION_NAMES.get(section_id, f"unknown {section_id}"))
        if section_id == 0:
            if s.name() == "name":
                _parse_names(s, module)
        elif section_id == 1:
            for _ in range(s.u32()):
                if s.byte() != 0x60:
                    raise WasmFormatError("type section: expected a function type")
                params = tuple(s.valtype() for _ in range(s.u32()))
                results = tuple(s.valtype() for _ in range(s.u32()))
                module.types.append((params, results))
        elif section_id == 2:
            for _ in range(s.u32()):
                mod, name = s.name(), s.name()
                kind = EXTERNAL_KINDS.get(s.byte(), "unknown")
                if kind == "func":
                    desc = s.u32()
                elif kind == "table":
                    desc = (s.valtype(), s.limits())
                elif kind == "memory":
                    shared = bool(s.data[s.pos] & 2)  # the limits' flags: bit 1 = shared
                    desc = s.limits() + (shared,)
                elif kind == "global":
                    desc = (s.valtype(), bool(s.byte()))
                elif kind == "tag":
                    desc = (s.byte(), s.u32())
                else:
                    raise WasmFormatError(f"import {mod}.{name}: unknown kind")
                module.imports.append((mod, name, kind, desc))
        elif section_id == 3:
            function_types = [s.u32() for _ in range(s.u32())]
        elif section_id == 6:
            for _ in range(s.u32()):
                valtype, mutable = s.valtype(), bool(s.byte())
                _const_expr(s)
                module.globals.append((valtype, mutable))
        elif section_id == 7:
            for _ in range(s.u32()):
                name = s.name()
                kind = EXTERNAL_KINDS.get(s.byte(), "unknown")
                module.exports.append((name, kind, s.u32()))
        elif section_id == 10:
            n_imported = sum(1 for imp in module.imports if imp[2] == "func")
            count = s.u32()
            if count != len(function_types):
                raise WasmFormatError("code and function sections disagree")
            for i in range(count):
                body_size = s.u32()
                body = Reader(data, s.pos, s.pos + body_size)
                s.pos += body_size
                func = Function(n_imported + i, function_types[i])
                for _ in range(body.u32()):
                    func.locals.append((body.u32(), body.valtype()))
                while not body.at_end():
                    func.body.append(_instruction(body))
                if not func.body or func.body[-1].opcode != 0x0B:
                    raise WasmFormatError(f"function {func.index}: body does not end with end")
                module.functions.append(func)
        elif section_id == 11:
            module.data_segments = s.u32()
        elif section_id == 12:
            module.data_count = s.u32()
        # table, memory, start, element, tag: nothing the checks need.
    for func in module.functions:
        func.name = module.function_names.get(func.index, f"function {func.index}")
    return module


# -- the kernel module's rules --------------------------------------------------------------------

def load_abi():
    """The ABI table (pkg/candle_web/backend/wasm/abi.py), loaded by path: the build runs before
    anything is installed and must not depend on the package importing."""
    spec = importlib.util.spec_from_file_location("_candle_wasm_abi", ABI_FILE)
    abi = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = abi  # dataclasses look the module up while building the classes
    spec.loader.exec_module(abi)
    return abi


def expected_signatures(exports=None) -> dict[str, tuple]:
    """export name -> (wasm params, wasm results) from an ABI table (default: EXPORTS, the
    single-thread builds')."""
    if exports is None:
        exports = load_abi().EXPORTS
    return {e.name: (e.wasm_params(), (e.result,) if e.result else ()) for e in exports}


def check_kernel_module(data: bytes, signatures: dict[str, tuple] | None = None,
                        allowed_extra=LINKER_FORCED_EXPORTS,
                        shared_memory: bool = False) -> list[str]:
    """Every way the module breaks the kernel rules, as messages (empty: it passes).
    shared_memory: the memory import must be shared (the threads build) or must not be (the
    others: Pyodide's memory is not shared, so a shared import would not link)."""
    if signatures is None:
        signatures = expected_signatures()
    try:
        module = parse_module(data)
    except WasmFormatError as exc:
        return [f"cannot decode the module: {exc}"]
    problems = []

    memory_imports = [imp for imp in module.imports if imp[2] == "memory"]
    if [(m, n) for m, n, _, _ in memory_imports] != [("env", "memory")]:
        problems.append("memory must be imported as env.memory (found imports: "
                        f"{[f'{m}.{n} ({k})' for m, n, k, _ in module.imports] or 'none'})")
    for _, _, _, desc in memory_imports:
        if desc[2] != shared_memory:
            problems.append(f"the memory import is {'shared' if desc[2] else 'not shared'}; "
                            f"this build's must {'' if shared_memory else 'not '}be shared")
    others = [f"{m}.{n} ({k})" for m, n, k, _ in module.imports if (m, n, k) != ("env", "memory", "memory")]
    if others:
        problems.append(f"imports other than env.memory: {', '.join(others)} (a libc call the "
                        "compiler emitted? build with -fno-builtin, or write the loop by hand)")
    if any(k == "memory" for _, k, _ in [(n, k, i) for n, k, i in module.exports]):
        problems.append("the module exports a memory (it must use the imported one)")

    exported = {name: (kind, index) for name, kind, index in module.exports}
    missing = sorted(set(signatures) - set(exported))
    extra = sorted(set(exported) - set(signatures) - set(allowed_extra))
    if missing:
        problems.append(f"exports missing from the ABI list: {', '.join(missing)}")
    if extra:
        problems.append(f"exports not in the ABI list: {', '.join(extra)}")
    for name, want in signatures.items():
        if name not in exported:
            continue
        kind, index = exported[name]
        if kind != "func":
            problems.append(f"export {name} is a {kind}, not a function")
            continue
        got = module.function_type(index)
        if got != want:
            problems.append(f"export {name} has signature {got[0]} -> {got[1]}, the ABI says "
                            f"{want[0]} -> {want[1]}")

    if module.data_segments or module.data_count:
        problems.append(f"the module has {module.data_segments or module.data_count} data "
                        "segment(s): constant tables or static variables went to memory (it "
                        "would be written into Pyodide's heap); use immediates")

    for func in module.functions:
        touched = {}
        for ins in func.body:
            if ins.opcode in (GLOBAL_GET, GLOBAL_SET):
                what = "global.get" if ins.opcode == GLOBAL_GET else "global.set"
                key = (what, module.global_name(ins.immediate))
                touched[key] = touched.get(key, 0) + 1
        for (what, gname), count in sorted(touched.items()):
            if gname == STACK_POINTER:
                problems.append(f"{func.name}: {count} x {what} of {STACK_POINTER}: the code uses "
                                "the stack (an array or a variable whose address is taken); keep "
                                "it in locals or put it in the scratch buffer")
            else:
                problems.append(f"{func.name}: {count} x {what} of {gname}: kernels must not use "
                                "globals")
    return problems


def summary(data: bytes) -> str:
    module = parse_module(data)
    n_ins = sum(len(f.body) for f in module.functions)
    simd = sum(1 for f in module.functions for i in f.body if i.opcode == 0xFD)
    relaxed = sum(1 for f in module.functions for i in f.body
                  if i.opcode == 0xFD and i.subop >= 0x100)
    return (f"{len(data)} bytes, {len(module.functions)} functions, {n_ins} instructions "
            f"({simd} SIMD, {relaxed} relaxed SIMD), imports "
            f"{[f'{m}.{n}' for m, n, _, _ in module.imports]}, {len(module.exports)} exports, "
            f"{len(module.globals)} globals, {module.data_segments} data segments")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", type=Path)
    args = parser.parse_args(argv)
    status = 0
    for path in args.modules:
        data = path.read_bytes()
        print(f"{path}: {summary(data)}")
        threads = "threads" in path.name  # kernels-threads.wasm: the team's exports, shared memory
        signatures = expected_signatures(load_abi().TEAM_EXPORTS) if threads else None
        for problem in check_kernel_module(data, signatures, shared_memory=threads):
            print(f"  FAIL: {problem}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
