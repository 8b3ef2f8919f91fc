"""Run a batch on Ray Data: the driver side.

The driver expands the inputs, fetches the model once (so actors on this machine find it
cached), reads which inputs already have a row for this model and these options, starts or
joins a Ray cluster, and runs

    from_items(inputs) -> map_batches(read_audio | read_text)           tasks, no CPU reserved
                       -> map_batches(Transcriber | Embedder)            actor pool
                       -> write_parquet(OUT/results, partition_cols=["status"])

then reads the dataset back for the summary. Ray is imported here, inside functions only: the
package imports without it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import BackendUnavailable, CandleError, InvalidOption
from . import records, stages
from .progress import BatchBar, BatchSummary

CLUSTER_EXTRA = "pip install 'candle-web[cluster]'"
# Transcription: one input per block, so a result is written as soon as it exists and a kill
# loses only inputs in flight. Embedding: texts are cheap, 64 a block.
TEXTS_PER_BLOCK = 64
MAX_BLOCKS = 20000


@dataclass
class ClusterOptions:
    """Where and how wide a batch runs. address None: $RAY_ADDRESS when set, else a local Ray
    started for this run, sized to the machine. concurrency None: as many actors as the
    cluster's CPUs allow at cpus_per_actor each."""

    address: str | None = None
    concurrency: int | None = None
    cpus_per_actor: float = 1.0
    threads_per_actor: int | None = None  # None: the node's default, as the single-file command
    verbose: bool = False


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401  (the Data library is the part batch needs)
    except ImportError as error:
        raise BackendUnavailable(f"candle-web batch runs on Ray, which is not installed here "
                                 f"({error}); install the extra: {CLUSTER_EXTRA}") from None
    return ray


# -- public entry points -------------------------------------------------------------------------
def transcribe_many(inputs, out, *, model: str = "whisper-tiny.en", options=None, formats=(),
                    cluster: ClusterOptions | None = None, retry_errors: bool = False,
                    stream=None, download_progress=None,
                    compute_type: str = "float32") -> BatchSummary:
    """Transcribe audio files (paths, folders, globs, list files) into OUT (records.py), with
    the model's arithmetic `compute_type` (the settings' compute types)."""
    from dataclasses import asdict

    from ..pipelines.transcribe import TranscribeOptions
    from ..pipelines.subtitles import FORMATS
    from .inputs import expand_audio_inputs

    options = options or TranscribeOptions()
    for fmt in formats:
        if fmt not in FORMATS:
            raise InvalidOption(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    audio = expand_audio_inputs(inputs)
    options_dict = asdict(options)
    options_dict["temperatures"] = list(options_dict["temperatures"])
    out = Path(out).expanduser().resolve()
    items = [{"path": item.path, "output_name": item.output_name} for item in audio]
    names = {item.path: item.output_name for item in audio}
    job = _Job(task="transcribe", out=out, model=model, options=options_dict, items=items,
               input_ids=[item.path for item in audio], per_block=1,
               read=stages.read_audio, model_class=stages.Transcriber,
               model_kwargs={"model": model, "options": options_dict,
                             "transcripts": str(out / records.TRANSCRIPTS) if formats else None,
                             "formats": tuple(formats), "compute_type": compute_type},
               cluster=cluster or ClusterOptions(), retry_errors=retry_errors, stream=stream,
               download_progress=download_progress)
    summary = job.run()
    if formats:
        _fill_transcripts(out, job.key, names, formats)
    return summary


def embed_many(files, out, *, model: str = "all-minilm-l6-v2", cluster: ClusterOptions | None = None,
               retry_errors: bool = False, stream=None, download_progress=None) -> BatchSummary:
    """Embed every line of JSON Lines files ({"text": ..., "id": ...} or a JSON string)."""
    from .inputs import parse_text_line, read_text_lines

    lines = read_text_lines(files)
    items, ids, seen = [], [], {}
    for line in lines:
        try:
            _, ident = parse_text_line(line.raw)
        except InvalidOption:
            ident = None  # the pipeline records the error row
        input_id = ident if ident is not None else f"{line.path}:{line.line}"
        if input_id in seen:
            raise InvalidOption(f"{line.path} line {line.line}: id {input_id!r} was already used "
                                f"on line {seen[input_id]}; ids must be unique")
        seen[input_id] = line.line
        items.append({"path": line.path, "line": line.line, "raw": line.raw, "input_id": input_id})
        ids.append(input_id)
    out = Path(out).expanduser().resolve()
    job = _Job(task="embed", out=out, model=model, options={"normalize": True}, items=items,
               input_ids=ids, per_block=TEXTS_PER_BLOCK, read=stages.read_text,
               model_class=stages.Embedder, model_kwargs={"model": model},
               cluster=cluster or ClusterOptions(), retry_errors=retry_errors, stream=stream,
               download_progress=download_progress)
    return job.run()


# -- the run -------------------------------------------------------------------------------------
@dataclass
class _Job:
    task: str
    out: Path
    model: str
    options: dict
    items: list
    input_ids: list
    per_block: int
    read: object
    model_class: type
    model_kwargs: dict
    cluster: ClusterOptions
    retry_errors: bool
    stream: object
    download_progress: object

    def run(self) -> BatchSummary:
        ray = import_ray()
        from .. import hub

        records.prepare_output(self.out, self.task)
        with records.OutputLock(self.out):
            files = hub.fetch_model(str(self.model), progress=self.download_progress)
            fingerprint = records.model_fingerprint(str(self.model), files)
            self.key = records.config_key(self.task, fingerprint, self.options)
            existing = records.existing_keys(self.out, self.key)
            skip = existing.done if self.retry_errors else existing.done | existing.errors
            started_ray = _connect(ray, self.cluster)
            try:
                summary = self._execute(ray, frozenset(skip))
            finally:
                if started_ray:
                    ray.shutdown()
            summary.quarantined = existing.quarantined
            return summary

    def _execute(self, ray, skip: frozenset) -> BatchSummary:
        actors, cpus = _actor_pool_size(ray, self.cluster)
        progress = ray.remote(num_cpus=0)(stages.ProgressCounter).remote()
        config = {"model": str(self.model), "options": records.canonical_options(self.options),
                  "config_key": self.key}
        blocks = min(MAX_BLOCKS, max(1, math.ceil(len(self.items) / self.per_block)))
        ds = ray.data.from_items(self.items, override_num_blocks=blocks)
        # Reading and decoding are light next to the model: no CPU reserved for them (the
        # actors hold the CPUs), at most one per CPU at a time.
        ds = ds.map_batches(self.read, batch_format="pyarrow", num_cpus=0,
                            compute=ray.data.TaskPoolStrategy(size=max(1, min(blocks, int(_cluster_cpus(ray))))),
                            fn_kwargs={"config": config, "skip": skip, "progress": progress})
        ds = ds.map_batches(self.model_class, batch_format="pyarrow", batch_size=self.per_block,
                            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus,
                            fn_constructor_kwargs={**self.model_kwargs, "progress": progress,
                                                   "threads": self.cluster.threads_per_actor})
        bar = BatchBar(f"batch {self.task}", len(self.items), self.task == "transcribe", self.stream)
        stop = threading.Event()

        def poll():
            while not stop.wait(0.5):
                try:
                    bar.update(ray.get(progress.snapshot.remote(), timeout=10))
                except Exception:  # a slow poll is no reason to stop the run
                    pass

        poller = threading.Thread(target=poll, daemon=True)
        started = time.perf_counter()
        poller.start()
        try:
            ds.write_parquet(str(self.out / records.RESULTS), partition_cols=["status"],
                             schema=records.SCHEMAS[self.task](), ray_remote_args={"num_cpus": 0})
        except ray.exceptions.RayError as error:
            stop.set()
            bar.close()
            raise BatchStopped(f"batch {self.task} stopped: {_cause_of(error)} "
                               f"(what was written to {self.out} is kept: rerun to resume)") from error
        finally:
            stop.set()
            poller.join()
        wall = time.perf_counter() - started
        snapshot = ray.get(progress.snapshot.remote())
        bar.update(snapshot, force=True)
        bar.close()
        summary = BatchSummary(task=self.task, out=str(self.out), inputs=len(self.items),
                               skipped=snapshot["skipped"][0], done=snapshot["done"][0],
                               failed=snapshot["failed"][0], audio_seconds=snapshot["done"][1],
                               wall_seconds=wall, actors=actors, cpus_per_actor=cpus)
        self._check_written(summary)
        return summary

    def _check_written(self, summary: BatchSummary) -> None:
        """From the dataset itself: inputs with no row for this config (missing), with more
        than one result row (duplicates), and the messages of those that failed."""
        rows, _ = records.read_rows(self.out, list(records.KEY_COLUMNS) + ["error"])
        wanted = set(self.input_ids)
        done_count: dict = {}
        errors: dict = {}
        for row in rows:
            if row["config_key"] != self.key or row["input_id"] not in wanted:
                continue
            if row["status"] == records.DONE:
                key = (row["input_id"], row["sha256"])
                done_count[key] = done_count.get(key, 0) + 1
            else:
                errors[row["input_id"]] = row["error"]
        done_ids = {input_id for input_id, _ in done_count}
        summary.duplicates = sum(1 for count in done_count.values() if count > 1)
        summary.errors = [(input_id, message) for input_id, message in errors.items()
                          if input_id not in done_ids]
        summary.missing = len(wanted - done_ids - set(errors))


class BatchStopped(CandleError):
    """The run as a whole failed (a model that does not load, a cluster that went away): the
    results written so far stay, a rerun resumes."""


def _cause_of(error: BaseException) -> str:
    """'ModelNotFound: ...': what a stage raised. Ray hands the driver a RayTaskError whose
    chain ends at its own UserCodeException; the stage's exception survives only in the remote
    traceback text, as its last-but-wrapped `module.Class: message` line."""
    for line in str(error).splitlines():
        found = re.match(r"([A-Za-z_][\w.]*): (.+)", line.strip())
        if found and not found.group(1).startswith("ray."):
            return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2)}"
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"


def _connect(ray, cluster: ClusterOptions) -> bool:
    """Join the given cluster, or start a local one. True when this run started Ray (and so
    shuts it down); a caller's own ray.init() is used as it is."""
    quiet = not cluster.verbose
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = not quiet
    context.print_on_execution_start = not quiet
    if quiet:
        # Ray's notices (token authentication, disabled progress bars) are for Ray users; the
        # batch prints its own progress and summary.
        logging.getLogger("ray").setLevel(logging.ERROR)
        # A failed run's cause is reported once, by the batch (BatchStopped), not also by Ray Data.
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    if ray.is_initialized():
        return False
    address = cluster.address or os.environ.get("RAY_ADDRESS") or "local"
    kwargs = {"log_to_driver": not quiet, "logging_level": logging.INFO if not quiet else logging.ERROR}
    if address == "local":
        kwargs["include_dashboard"] = False
    else:
        _check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError) as error:
        raise InvalidOption(f"--ray-address {address}: cannot join a Ray cluster there ({error})") from None
    return True


def _check_reachable(address: str) -> None:
    """A head that is not there fails in seconds with its address, instead of Ray retrying to
    reach it for minutes."""
    import socket

    match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d+)", address)
    if match is None:
        return  # "auto", ray://... : left to Ray
    try:
        socket.create_connection((match.group(1), int(match.group(2))), timeout=5).close()
    except OSError as error:
        raise InvalidOption(f"--ray-address {address}: no Ray head answers there "
                            f"({error.strerror or error})") from None


def _cluster_cpus(ray) -> float:
    return float(ray.cluster_resources().get("CPU", 0.0))


def _actor_pool_size(ray, cluster: ClusterOptions) -> tuple[int, float]:
    cpus = cluster.cpus_per_actor
    if not cpus > 0:
        raise InvalidOption(f"--cpus-per-actor must be > 0, got {cpus}")
    total = _cluster_cpus(ray)
    largest = max((node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node.get("Alive")),
                  default=0.0)
    if cpus > largest:
        raise InvalidOption(f"--cpus-per-actor {cpus:g}: no node of the cluster has that many CPUs "
                            f"(the largest has {largest:g})")
    actors = cluster.concurrency or max(1, int(total // cpus))
    if actors < 1:
        raise InvalidOption(f"--concurrency must be >= 1, got {actors}")
    if actors * cpus > total:
        raise InvalidOption(f"--concurrency {actors} x --cpus-per-actor {cpus:g} needs "
                            f"{actors * cpus:g} CPUs; the cluster has {total:g}")
    return actors, cpus


def _fill_transcripts(out: Path, key: str, names: dict, formats) -> None:
    """Per-file transcripts for results that have none in a requested format (a rerun asking
    for SRT after a TXT run, or a run killed between its Parquet write and its files)."""
    folder = out / records.TRANSCRIPTS
    rows, _ = records.read_rows(out, ["input_id", "config_key", "text", "segments", "language",
                                      "audio_seconds"], status=records.DONE)
    for row in rows:
        name = names.get(row["input_id"])
        if row["config_key"] != key or name is None:
            continue
        wanted = [fmt for fmt in formats if not (folder / f"{name}.{fmt}").exists()]
        if wanted:
            stages.write_transcripts(stages.transcript_from_row(row), str(folder), name, wanted)
