"""Stop strings over streamed text.

A stop string can arrive split over several pieces ("<|us" + "er|>"), so the matcher holds
back the end of the text while it could still be the start of a stop string, and releases
it as soon as it cannot. On a match, the text before the stop string is released and the
rest is dropped.
"""

from __future__ import annotations

from ..core.errors import CandleError


class StopStringMatcher:
    def __init__(self, stop_strings=()):
        self.stop_strings = tuple(s for s in stop_strings)
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise CandleError(f"stop strings must be non-empty strings, got {stop_strings!r}")
        self.pending = ""
        self.stopped = False
        self.matched = None

    def feed(self, piece: str) -> str:
        """Add streamed text; returns the part that is safe to show."""
        if self.stopped:
            return ""
        self.pending += piece
        if not self.stop_strings:
            out, self.pending = self.pending, ""
            return out
        found = [(self.pending.find(s), s) for s in self.stop_strings]
        found = [(at, s) for at, s in found if at >= 0]
        if found:
            at, self.matched = min(found)
            self.stopped = True
            out, self.pending = self.pending[:at], ""
            return out
        hold = self._partial_match_length()
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """At the end of generation: held-back text that never became a stop string."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _partial_match_length(self) -> int:
        """Length of the longest end of `pending` that begins some stop string."""
        best = 0
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:length]):
                    best = length
                    break
        return best
