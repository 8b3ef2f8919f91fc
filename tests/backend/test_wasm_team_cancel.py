"""A cancel lands anywhere: the page interrupts Python (KeyboardInterrupt) wherever it is. The
two-thread parts' bookkeeping of the shared memory must stay consistent when it lands between
releasing a block and forgetting it: before, the Whisper decoder step released its old
cross-attention copies, was interrupted while copying the new ones, and at the next audio
released the old offsets again ("team arena: ... is not an allocated block"), so every later
transcription in that page failed (tests/ui/test_transcribe.py's cancel-then-run-again).
These run the bookkeeping on the real Arena, with no wasm module.
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.backend.wasm import team_parts
from candle_web.backend.wasm.team import Arena


class InterruptingTeam:
    """An arena host whose `put` raises KeyboardInterrupt on the put numbered `interrupt_at`."""

    def __init__(self):
        self.arena = Arena(1024, lambda end: None)
        self.puts = 0
        self.interrupt_at = None

    def alloc(self, nbytes):
        return self.arena.alloc(nbytes)

    def release(self, offset):
        self.arena.release(offset)

    def put(self, array):
        self.puts += 1
        if self.puts == self.interrupt_at:
            raise KeyboardInterrupt
        return self.arena.alloc(np.asarray(array).nbytes)

    def write(self, offset, array):
        pass


class Base:
    def __init__(self):
        self.cross = None

    def _cross_kv(self, features):
        return self.cross


def decoder_step(team):
    step = object.__new__(team_parts.TeamWhisperDecoderStep)
    step.team, step.base, step._cross = team, Base(), None
    return step


def new_cross(blocks=3):
    return [(np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32)) for _ in range(blocks)]


def test_cross_copies_interrupted_mid_way_are_not_released_twice():
    team = InterruptingTeam()
    step = decoder_step(team)
    step.base.cross = new_cross()
    step._cross_kv(None)  # the first audio's copies
    step.base.cross = new_cross()
    team.interrupt_at = team.puts + 3  # the cancel lands while the next audio's are copied
    with pytest.raises(KeyboardInterrupt):
        step._cross_kv(None)
    step.base.cross = new_cross()
    offsets = step._cross_kv(None)  # the audio after the cancel
    assert len(offsets) == 3
    assert all(team.arena._sizes.get(k) and team.arena._sizes.get(v) for k, v in offsets)


def test_buffers_and_mirrors_forget_a_block_before_releasing_it(monkeypatch):
    team = InterruptingTeam()
    buffers = team_parts._Buffers(team)
    first = buffers.get("x", 64)
    real_release = team.release

    def interrupted_release(offset):
        real_release(offset)
        raise KeyboardInterrupt  # after the arena took it back, before anything else

    monkeypatch.setattr(team, "release", interrupted_release)
    with pytest.raises(KeyboardInterrupt):
        buffers.get("x", 4096)  # grows: releases the 64-byte block
    monkeypatch.setattr(team, "release", real_release)
    # The interrupted grow forgot the old block: the next get takes a new one (the arena may
    # hand the same offset out again), and growing it later releases that one block once.
    grown = buffers.get("x", 4096)
    assert team.arena._sizes == {grown: 4096}
    buffers.get("x", 1 << 16)
    assert list(team.arena._sizes.values()) == [1 << 16]
