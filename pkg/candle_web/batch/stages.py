"""The stages of a batch, as Ray Data runs them (runner.py wires them up):

    inputs (from_items) -> read_audio / read_text (map_batches, tasks: hash the input, skip what
    is done, decode) -> Transcriber / Embedder (map_batches with a callable class: an actor pool,
    each actor loads the model once) -> write_parquet

Every stage handles one input at a time and turns a failure of that input into an error row
(the stage and the message), so one broken file never stops the run. Nothing here imports Ray:
the functions and classes are plain Python that Ray ships to its workers. pyarrow (a Ray
dependency) is imported inside them.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import warnings
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import records
from .records import DONE, ERROR

PENDING = "pending"  # decoded, waiting for the model: never written
SAMPLE_RATE = 16000
HASH_CHUNK = 1 << 20


def decoded_schema(task: str):
    """The schema between the read stage and the model stage: the task's result schema plus
    the decoded payload (float32 samples as bytes, or the text to embed)."""
    import pyarrow as pa

    schema = records.SCHEMAS[task]()
    return schema.append(pa.field("payload", pa.large_binary()))


def _table(rows: list[dict], schema):
    import pyarrow as pa

    return pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows],
                                schema=schema)


def _error(row: dict, stage: str, error: BaseException) -> dict:
    message = str(error) or type(error).__name__
    path = row.get("path")
    if stage in ("read", "decode") and path and not message.startswith(f"{path}:"):
        message = f"{path}: {message}"
    return {**row, "status": ERROR, "error_stage": stage, "error_type": type(error).__name__,
            "error": message, "worker": worker_name(),
            "finished_at": datetime.now(timezone.utc), "payload": None}


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def file_sha256(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _report(progress, kind: str, input_id: str, seconds: float = 0.0) -> None:
    if progress is not None:
        progress.mark.remote(kind, input_id, seconds)


# -- transcribe ----------------------------------------------------------------------------------
def read_audio(batch, *, config: dict, skip: frozenset, progress=None):
    """Hash each input file, drop the ones already done for this config, decode the rest to
    16 kHz mono float32 exactly as `candle-web transcribe` does (load_audio on the path)."""
    from ..core.errors import CandleError
    from ..io.audio import load_audio

    schema = decoded_schema("transcribe")
    out = []
    for item in batch.to_pylist():
        path = item["path"]
        row = {**config, "input_id": path, "path": path, "output_name": item["output_name"]}
        started = time.perf_counter()
        try:
            row["sha256"], row["bytes"] = file_sha256(path)
        except OSError as error:
            if (path, None) in skip:  # unreadable last time too, and already in the errors table
                _report(progress, "skipped", path)
                continue
            reason = error.strerror or str(error)
            out.append(_error(row, "read", OSError(f"cannot read it: {reason}")))
            continue
        if (path, row["sha256"]) in skip:
            _report(progress, "skipped", path)
            continue
        try:
            samples = load_audio(path)
        except (CandleError, OSError, ValueError, MemoryError) as error:
            out.append(_error(row, "decode", error))
            continue
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        row.update(status=PENDING, payload=samples.tobytes(),
                   audio_seconds=len(samples) / SAMPLE_RATE,
                   read_seconds=time.perf_counter() - started)
        out.append(row)
    return _table(out, schema)


def transcript_from_row(row: dict):
    """The Transcript a result row stores (what subtitles.render needs), for per-file outputs
    written after the fact (a rerun asking for a format the first run did not write)."""
    from ..pipelines.transcribe import Segment, Transcript

    segments = [Segment(**segment) for segment in row["segments"] or []]
    return Transcript(text=row["text"], segments=segments, language=row["language"],
                      duration=row["audio_seconds"])


def write_transcripts(transcript, folder: str, name: str, formats) -> None:
    """OUT/transcripts/NAME.FORMAT, each written to a temporary name first and renamed, so a
    kill never leaves half a file under the final name."""
    from ..pipelines import subtitles

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        final = target / f"{name}.{fmt}"
        temporary = target / f".{name}.{fmt}.{os.getpid()}.tmp"
        temporary.write_text(subtitles.render(transcript, fmt), encoding="utf-8")
        os.replace(temporary, final)


def set_kernel_threads(threads: int | None) -> None:
    """NUMBA_NUM_THREADS for this actor's kernels, set before numba is first imported (the
    actor's process is its own; the model loads on the first input)."""
    if threads:
        os.environ["NUMBA_NUM_THREADS"] = str(int(threads))


class Transcriber:
    """The model stage: one instance per Ray actor. The model loads on the first input that
    needs it (a rerun where everything is done never loads it), then stays loaded.

    The kernels keep the node's default thread count (NUMBA_NUM_THREADS: all its cores), as
    `candle-web transcribe` has there: the fused steps' reductions split by thread, so another
    count would move log-probabilities in the 7th digit and the answers would no longer be the
    single-file command's, bit for bit. --cpus-per-actor is what Ray reserves; threads (the
    --threads-per-actor option) sets NUMBA_NUM_THREADS for this actor instead."""

    def __init__(self, model: str, options: dict, transcripts: str | None = None,
                 formats=(), progress=None, threads: int | None = None,
                 compute_type: str = "float32"):
        set_kernel_threads(threads)
        self.model_spec, self.options_dict = model, options
        self.compute_type = compute_type
        self.transcripts, self.formats = transcripts, tuple(formats)
        self.progress = progress
        self.loaded = None
        self.vad_model = None

    def _model(self):
        if self.loaded is None:
            from ..pipelines.transcribe import TranscribeOptions
            from ..pipelines import load_whisper

            from ..models.silero_vad import VadOptions
            from ..pipelines import load_vad

            options = dict(self.options_dict)
            options["temperatures"] = tuple(options["temperatures"])
            if options.get("vad") is not None:  # --vad: asdict made its VadOptions a dict
                options["vad"] = VadOptions(**options["vad"])
            from ..backend.settings import override_settings

            override_settings(compute_type=self.compute_type)  # read when the parts are built
            loaded = load_whisper(self.model_spec)
            options = TranscribeOptions(**options)
            self.vad_model = load_vad() if options.vad is not None else None
            self.loaded = (loaded.model, loaded.tokenizer, options)
        return self.loaded

    def __call__(self, batch):
        from ..pipelines.transcribe import transcribe

        out = []
        for row in batch.to_pylist():
            payload = row.pop("payload")
            if row["status"] == ERROR:
                _report(self.progress, "failed", row["input_id"])
                out.append(row)
                continue
            # A model that does not load fails the run (every input would fail the same way),
            # it does not fill the errors table.
            model, tokenizer, options = self._model()
            started = time.perf_counter()
            try:
                samples = np.frombuffer(payload, dtype=np.float32)
                result = transcribe(model, tokenizer, samples, options, vad_model=self.vad_model)
                row.update(status=DONE, text=result.text, language=result.language,
                           segments=[_segment_dict(segment) for segment in result.segments])
                if self.transcripts and self.formats:
                    write_transcripts(result, self.transcripts, row["output_name"], self.formats)
            except Exception as error:  # this input fails; the run goes on
                row = _error(row, "transcribe", error)
            row["transcribe_seconds"] = time.perf_counter() - started
            row["worker"], row["finished_at"] = worker_name(), datetime.now(timezone.utc)
            _report(self.progress, "done" if row["status"] == DONE else "failed", row["input_id"],
                    row.get("audio_seconds") or 0.0)
            out.append(row)
        return records.to_table(out, "transcribe")


def _segment_dict(segment) -> dict:
    values = asdict(segment)
    return {name: values[name] for name, _ in records.SEGMENT_FIELDS}


# -- embed ---------------------------------------------------------------------------------------
def read_text(batch, *, config: dict, skip: frozenset, progress=None):
    """Parse each JSONL line (an object with "text" and optionally "id", or a JSON string),
    drop the ones already done, pass the text on."""
    from .inputs import parse_text_line

    schema = decoded_schema("embed")
    out = []
    for item in batch.to_pylist():
        # The driver named each line's input: its "id", else path:line.
        row = {**config, "path": item["path"], "line": item["line"], "input_id": item["input_id"]}
        try:
            text, _ = parse_text_line(item["raw"])
        except Exception as error:
            # The hash of the line as it is: a line refused before with these very bytes is in
            # the errors table already; an edited one is tried again.
            row["sha256"] = hashlib.sha256(item["raw"].encode("utf-8")).hexdigest()
            if (row["input_id"], row["sha256"]) in skip:
                _report(progress, "skipped", row["input_id"])
                continue
            out.append(_error(row, "parse", ValueError(f"{item['path']} line {item['line']}: {error}")))
            continue
        encoded = text.encode("utf-8")
        row["sha256"] = hashlib.sha256(encoded).hexdigest()
        if (row["input_id"], row["sha256"]) in skip:
            _report(progress, "skipped", row["input_id"])
            continue
        row.update(status=PENDING, text=text, payload=encoded)
        out.append(row)
    return _table(out, schema)


class Embedder:
    """The model stage of `batch embed`: each text is embedded on its own, as `candle-web embed
    TEXT` does, so a result never depends on which other texts Ray put in the same batch."""

    def __init__(self, model: str, progress=None, threads: int | None = None):
        set_kernel_threads(threads)
        self.model_spec, self.progress = model, progress
        self.embedder = None

    def __call__(self, batch):
        out = []
        for row in batch.to_pylist():
            row.pop("payload")
            if row["status"] == ERROR:
                _report(self.progress, "failed", row["input_id"])
                out.append(row)
                continue
            if self.embedder is None:
                from ..pipelines import load_bert
                from ..pipelines.embed import SentenceEmbedder

                loaded = load_bert(self.model_spec)
                self.embedder = SentenceEmbedder(loaded.model, loaded.tokenizer)
            started = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # truncation is recorded in its column
                    result = self.embedder.embed([row["text"]])
                row.update(status=DONE, embedding=result.vectors[0].tolist(),
                           tokens=int(result.token_counts[0]), truncated=bool(result.truncated[0]))
            except Exception as error:
                row = _error(row, "embed", error)
            row["embed_seconds"] = time.perf_counter() - started
            row["worker"], row["finished_at"] = worker_name(), datetime.now(timezone.utc)
            _report(self.progress, "done" if row["status"] == DONE else "failed", row["input_id"])
            out.append(row)
        return records.to_table(out, "embed")


class ProgressCounter:
    """Counts what the stages report (a Ray actor; the driver polls snapshot()). Keyed by input
    id, so a task Ray retries after a worker died is not counted twice."""

    def __init__(self):
        self.kinds = {"skipped": {}, "done": {}, "failed": {}}

    def mark(self, kind: str, input_id: str, seconds: float = 0.0) -> None:
        for other in self.kinds.values():
            other.pop(input_id, None)
        self.kinds[kind][input_id] = seconds

    def snapshot(self) -> dict:
        return {kind: (len(values), float(sum(values.values()))) for kind, values in self.kinds.items()}
