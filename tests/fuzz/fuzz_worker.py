"""The fuzzing child: runs one case at a time for harness.py under an address-space cap.

Started as ``python fuzz_worker.py MEMORY_BYTES DUMP_PATH``. It reads requests from stdin and
writes results to its own copy of stdout (fd 1 itself is pointed at stderr, so a target that
prints cannot corrupt the protocol). Each message is a 4-byte little-endian length and a
pickle. Requests: ``(target name, input bytes, timeout seconds)``; results: a dict with
``outcome`` "ok", "typed", "untyped" or "memory" and, for the last two, ``type``, ``message``,
``site`` (the last frame inside pkg/candle_web) and ``traceback``.

Why a separate process: Python's ``re`` and numpy loops hang in C code where no signal handler
runs, and an allocation beyond the bound must fail here (MemoryError under RLIMIT_AS) instead
of exhausting the machine. The parent kills this process when a case runs past its limit.
faulthandler writes this process's Python stack to DUMP_PATH shortly before the parent's
deadline and on a fatal signal, so hangs and crashes still name their code site.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import struct
import sys
import traceback
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
REPO_ROOT = FUZZ_DIR.parent.parent
PKG_DIR = REPO_ROOT / "pkg" / "candle_web"
VENV_DIR = REPO_ROOT / ".venv"  # inside the checkout, but not the project's code
# The stack dump comes this long before the parent's deadline, so it is written before the kill.
DUMP_LEAD_SECONDS = 0.3
MAX_MESSAGE_CHARS = 500
MAX_TRACEBACK_CHARS = 6000

LENGTH = struct.Struct("<I")


def read_message(stream):
    header = stream.read(LENGTH.size)
    if len(header) < LENGTH.size:
        return None
    (size,) = LENGTH.unpack(header)
    return pickle.loads(stream.read(size))


def write_message(stream, value) -> None:
    payload = pickle.dumps(value)
    stream.write(LENGTH.pack(len(payload)) + payload)
    stream.flush()


def relative_site(filename: str, line: int, function: str) -> str:
    try:
        shown = Path(filename).resolve().relative_to(REPO_ROOT)
    except ValueError:
        shown = Path(filename).name
    return f"{shown}:{line} in {function}"


def choose_site(frames: list) -> tuple:
    """(filename, line, function) of the frame to blame, from frames listed outermost first:
    the innermost one inside pkg/candle_web (where the package let the error through), else
    the innermost one in this repository (a target), else the innermost of all."""
    def inside(folder: Path):
        return [f for f in frames if Path(f[0]).resolve().is_relative_to(folder)
                and not Path(f[0]).resolve().is_relative_to(VENV_DIR)]

    chosen = inside(PKG_DIR) or inside(REPO_ROOT) or frames or [("?", 0, "?")]
    return chosen[-1]


def code_site(tb) -> str:
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(tb)]
    return relative_site(*choose_site(frames))


def describe(error: BaseException, outcome: str) -> dict:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    kind = type(error)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    return {"outcome": outcome, "type": name, "message": str(error)[:MAX_MESSAGE_CHARS],
            "site": code_site(error.__traceback__), "traceback": text[-MAX_TRACEBACK_CHARS:]}


def run_case(run, data: bytes) -> dict:
    from candle_web.core.errors import CandleError

    try:
        run(data)
    except CandleError:
        return {"outcome": "typed"}
    except MemoryError as error:
        return describe(error, "memory")
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit from a parser is a finding too
        return describe(error, "untyped")
    return {"outcome": "ok"}


def main() -> None:
    memory_bytes, dump_path = int(sys.argv[1]), sys.argv[2]
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    for folder in (REPO_ROOT / "native", REPO_ROOT / "pkg", REPO_ROOT):  # REPO_ROOT: tests.fuzz
        sys.path.insert(0, str(folder))
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    dump = open(dump_path, "w")
    faulthandler.enable(file=dump)

    from tests.fuzz import targets_testlib  # after the cap: imports count against it, as in real use

    write_message(protocol, {"ready": True})
    while (request := read_message(requests)) is not None:
        name, data, timeout = request
        dump.seek(0)
        dump.truncate()
        faulthandler.dump_traceback_later(max(timeout - DUMP_LEAD_SECONDS, 0.1), file=dump)
        result = run_case(targets_testlib.find(name).run, data)
        faulthandler.cancel_dump_traceback_later()
        write_message(protocol, result)


if __name__ == "__main__":
    main()
