"""The batch progress line on stderr, over files and hours of audio, and the closing summary."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

WIDTH = 24


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class BatchBar:
    """`batch  45%|███████     | 9/20 files, 0.012 h audio, 2 failed [0:00:31<0:00:38]`. On a
    terminal it redraws one line; otherwise (a log file) it prints a line at most every 10 s."""

    def __init__(self, label: str, total: int, with_audio: bool, stream=None):
        self.label, self.total, self.with_audio = label, total, with_audio
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self.last_line = 0.0
        self.last_text = None

    def update(self, snapshot: dict, force: bool = False) -> None:
        skipped, _ = snapshot["skipped"]
        done, audio = snapshot["done"]
        failed, _ = snapshot["failed"]
        finished = skipped + done + failed
        elapsed = time.perf_counter() - self.started
        fraction = min(finished / self.total, 1.0) if self.total else 1.0
        bar = "█" * int(fraction * WIDTH) + " " * (WIDTH - int(fraction * WIDTH))
        worked = done + failed
        remaining = self.total - finished
        eta = elapsed / worked * remaining if worked else 0.0
        parts = [f"{finished}/{self.total} files"]
        if self.with_audio:
            parts.append(f"{audio / 3600:.3f} h audio")
        if skipped:
            parts.append(f"{skipped} already done")
        if failed:
            parts.append(f"{failed} failed")
        text = (f"{self.label} {fraction * 100:3.0f}%|{bar}| {', '.join(parts)} "
                f"[{_clock(elapsed)}<{_clock(eta)}]")
        if text == self.last_text and not force:
            return
        now = time.perf_counter()
        if self.tty:
            self.stream.write("\r" + text)
        elif force or now - self.last_line >= 10.0:
            self.stream.write(text + "\n")
            self.last_line = now
        else:
            return
        self.last_text = text
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.last_text is not None:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class BatchSummary:
    """What a run did. `inputs` = `done + skipped + failed + missing`, where missing (inputs
    with no row at all after the run) is zero unless the run was cut short."""

    task: str
    out: str
    inputs: int
    done: int = 0          # results written by this run
    skipped: int = 0       # already had a result (or, without --retry-errors, an error) row
    failed: int = 0        # error rows written by this run
    missing: int = 0
    duplicates: int = 0    # inputs with more than one result row for this config (should be 0)
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    actors: int = 0
    cpus_per_actor: float = 0.0
    quarantined: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # (input id, message) of this run's failures

    @property
    def files_per_minute(self) -> float:
        return (self.done + self.failed) / self.wall_seconds * 60 if self.wall_seconds else 0.0

    @property
    def audio_hours_per_hour(self) -> float:
        return self.audio_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def lines(self) -> list[str]:
        noun = "files" if self.task == "transcribe" else "texts"
        verb = "transcribed" if self.task == "transcribe" else "embedded"
        out = [f"batch {self.task}: {self.inputs} {noun}: {self.done} {verb}, "
               f"{self.skipped} already done, {self.failed} failed"
               + (f", {self.missing} with no result (run cut short)" if self.missing else "")]
        rate = f"{self.files_per_minute:.1f} {noun}/min"
        if self.task == "transcribe":
            rate += (f", {self.audio_seconds / 3600:.4f} h of audio, "
                     f"{self.audio_hours_per_hour:.1f} audio h/h")
        out.append(f"  {self.wall_seconds:.1f} s with {self.actors} actor(s) x "
                   f"{self.cpus_per_actor:g} CPU: {rate}")
        for input_id, message in self.errors[:10]:
            out.append(f"  failed: {message if input_id in message else f'{input_id}: {message}'}")
        if len(self.errors) > 10:
            out.append(f"  ... and {len(self.errors) - 10} more")
        if self.failed or self.errors:
            out.append(f"  errors table: {self.out}/results/status=error")
        if self.duplicates:
            out.append(f"  warning: {self.duplicates} input(s) have more than one result row")
        for path in self.quarantined:
            out.append(f"  moved an unreadable (half-written) file aside: {path}")
        out.append(f"  results: {self.out}/results/status=done")
        return out
