"""The output folder of a batch: one Parquet dataset, partitioned by status.

    OUT/batch.json                  which task wrote here (transcribe or embed), and the layout
    OUT/results/status=done/*.parquet    one row per input: its result
    OUT/results/status=error/*.parquet   the errors table: one row per input that failed, with
                                         the stage and the message
    OUT/transcripts/NAME.txt|srt|vtt     per-file transcripts, when asked for (transcribe)
    OUT/quarantine/                      Parquet files a killed run left half-written

Every row carries the input's id (its path; for embed the line's "id", else path:line), the
sha256 of the input (the file's bytes; for embed the text's UTF-8, or the raw line's when it
does not parse; none for a file that could not be read) and the config key: a hash of the model (its files' sha256 from the registry, or its local files' sizes
and times) and the decoding options. A rerun skips an input whose (id, sha256, config key)
already has a row, so nothing is computed twice and a killed run loses only what was not
written yet. pyarrow comes with Ray (the `cluster` extra) and is imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InvalidOption

LAYOUT_VERSION = 1
RESULTS = "results"
TRANSCRIPTS = "transcripts"
QUARANTINE = "quarantine"
DONE, ERROR = "done", "error"
KEY_COLUMNS = ("input_id", "sha256", "config_key")

SEGMENT_FIELDS = (("id", "int32"), ("seek", "int32"), ("start", "float64"), ("end", "float64"),
                  ("text", "string"), ("tokens", "tokens"), ("temperature", "float64"),
                  ("avg_logprob", "float64"), ("compression_ratio", "float64"),
                  ("no_speech_prob", "float64"))


def _common_fields(pa):
    return [("input_id", pa.string()), ("path", pa.string()), ("sha256", pa.string()),
            ("model", pa.string()), ("options", pa.string()), ("config_key", pa.string()),
            ("status", pa.string())]


def _trailer_fields(pa):
    return [("worker", pa.string()), ("finished_at", pa.timestamp("us", tz="UTC")),
            ("error_stage", pa.string()), ("error_type", pa.string()), ("error", pa.string())]


def segment_type():
    import pyarrow as pa

    types = {"int32": pa.int32(), "float64": pa.float64(), "string": pa.string(),
             "tokens": pa.list_(pa.int32())}
    return pa.struct([(name, types[kind]) for name, kind in SEGMENT_FIELDS])


def transcribe_schema():
    import pyarrow as pa

    return pa.schema(_common_fields(pa) + [
        ("output_name", pa.string()), ("bytes", pa.int64()), ("text", pa.string()),
        ("language", pa.string()), ("audio_seconds", pa.float64()),
        ("segments", pa.list_(segment_type())), ("read_seconds", pa.float64()),
        ("transcribe_seconds", pa.float64())] + _trailer_fields(pa))


def embed_schema():
    import pyarrow as pa

    return pa.schema(_common_fields(pa) + [
        ("line", pa.int64()), ("text", pa.string()), ("embedding", pa.list_(pa.float32())),
        ("tokens", pa.int32()), ("truncated", pa.bool_()), ("embed_seconds", pa.float64())]
        + _trailer_fields(pa))


SCHEMAS = {"transcribe": transcribe_schema, "embed": embed_schema}


def to_table(rows: list[dict], task: str):
    """A pyarrow Table of `rows` in the task's schema (missing columns are null), so that every
    file of the dataset has the same schema whatever its rows hold."""
    import pyarrow as pa

    schema = SCHEMAS[task]()
    return pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows],
                                schema=schema)


# -- configuration identity ---------------------------------------------------------------------
def model_fingerprint(spec: str, files: dict) -> dict:
    """What identifies a model's weights: for a registry model its files' published sha256,
    for a local folder or file its files' sizes and modification times (re-hashing hundreds of
    MB on every run would cost more than it protects)."""
    from .. import hub

    registry = hub.default_registry()
    if spec in registry:
        entry = registry[spec]
        return {"registry": spec, "files": {f.name: f.sha256 or f"size:{f.size}" for f in entry.files}}
    described = {}
    for name, path in sorted(files.items()):
        stat = Path(path).stat()
        described[name] = f"size:{stat.st_size},mtime_ns:{stat.st_mtime_ns}"
    return {"local": str(Path(spec).expanduser().resolve()), "files": described}


def config_key(task: str, fingerprint: dict, options: dict) -> str:
    canonical = json.dumps({"task": task, "model": fingerprint, "options": options},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def canonical_options(options: dict) -> str:
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


# -- the output folder ---------------------------------------------------------------------------
@dataclass
class Existing:
    """What earlier runs wrote for this config: the keys with a result, the keys with an error,
    and the Parquet files moved aside as unreadable."""

    done: set
    errors: set
    quarantined: list


def prepare_output(out: Path, task: str) -> None:
    """Create OUT and its manifest, or check that an existing one belongs to the same task."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "batch.json"
    if manifest.exists():
        try:
            recorded = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise InvalidOption(f"{manifest}: unreadable batch manifest ({error})") from None
        if recorded.get("task") != task:
            raise InvalidOption(f"--out {out}: holds the results of `batch {recorded.get('task')}`, "
                                f"not `batch {task}`; choose another folder")
        if recorded.get("layout") != LAYOUT_VERSION:
            raise InvalidOption(f"--out {out}: written in layout {recorded.get('layout')}, this "
                                f"version writes layout {LAYOUT_VERSION}; choose another folder")
        return
    manifest.write_text(json.dumps({"task": task, "layout": LAYOUT_VERSION}) + "\n", encoding="utf-8")


def parquet_files(out: Path, status: str | None = None) -> list[Path]:
    root = out / RESULTS
    pattern = f"status={status}" if status else "status=*"
    return sorted(path for path in root.glob(f"{pattern}/**/*.parquet") if path.is_file())


def read_rows(out: Path, columns, status: str | None = None, quarantine: bool = False):
    """(rows as dicts with a 'status', unreadable files). A file that does not read (a write
    a kill cut short) is skipped; with quarantine=True it is moved to OUT/quarantine/, so the
    inputs it held are done again and the dataset reads cleanly."""
    import pyarrow.parquet as pq

    rows, bad = [], []
    for path in parquet_files(out, status):
        try:
            table = pq.read_table(path, columns=[c for c in columns if c != "status"])
        except Exception as error:  # pyarrow raises ArrowInvalid, OSError... for a cut file
            bad.append((path, error))
            continue
        status_of_file = path.parent.name.split("=", 1)[1]
        for row in table.to_pylist():
            row["status"] = status_of_file
            rows.append(row)
    if quarantine and bad:
        target = out / QUARANTINE
        target.mkdir(exist_ok=True)
        for path, _ in bad:
            os.replace(path, target / f"{path.parent.name}-{path.name}")
    return rows, bad


def existing_keys(out: Path, key: str) -> Existing:
    rows, bad = read_rows(out, KEY_COLUMNS, quarantine=True)
    done, errors = set(), set()
    for row in rows:
        if row["config_key"] != key:
            continue
        (done if row["status"] == DONE else errors).add((row["input_id"], row["sha256"]))
    return Existing(done, errors, [str(path) for path, _ in bad])


class OutputLock:
    """OUT/.lock while a run writes there: a second run on the same folder at the same time
    would read the first one's half-written files as broken. A lock whose process is gone (a
    killed run) is taken over."""

    def __init__(self, out: Path):
        self.path = out / ".lock"
        self.held = False

    def __enter__(self):
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder and holder.get("host") == me["host"] and _alive(holder.get("pid")):
                    raise InvalidOption(f"--out {self.path.parent}: another batch run (pid "
                                        f"{holder['pid']}) is writing there") from None
                if holder and holder.get("host") != me["host"]:
                    raise InvalidOption(f"--out {self.path.parent}: a batch run on "
                                        f"{holder.get('host')} (pid {holder.get('pid')}) holds "
                                        f"{self.path}; remove it if that run has ended") from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(me, handle)
            self.held = True
            return self
        raise InvalidOption(f"--out {self.path.parent}: could not take {self.path}")

    def _holder(self):
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def __exit__(self, *exc):
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
