"""Stop strings over streamed pieces: split matches, hold-back and release."""

from __future__ import annotations

import pytest

from candle_web.core.errors import CandleError
from candle_web.generation import StopStringMatcher


def feed_all(matcher, pieces):
    return [matcher.feed(p) for p in pieces]


def test_stop_string_split_over_pieces():
    matcher = StopStringMatcher(["<|user|>"])
    assert feed_all(matcher, ["Hello <|us", "er|> more", "ignored"]) == ["Hello ", "", ""]
    assert matcher.stopped and matcher.matched == "<|user|>"
    assert matcher.flush() == ""


def test_held_text_is_released_when_it_stops_matching():
    matcher = StopStringMatcher(["STOP"])
    assert feed_all(matcher, ["a S", "T", "x", "y"]) == ["a ", "", "STx", "y"]
    assert not matcher.stopped


def test_earliest_stop_string_wins():
    matcher = StopStringMatcher(["world", "lo w"])
    assert matcher.feed("hello world") == "hel"
    assert matcher.matched == "lo w"


def test_text_held_at_the_end_is_flushed():
    matcher = StopStringMatcher(["\n\nUser:"])
    assert matcher.feed("answer\n\nUs") == "answer"
    assert matcher.flush() == "\n\nUs"


def test_no_stop_strings_passes_everything():
    matcher = StopStringMatcher()
    assert feed_all(matcher, ["a", "<", "b"]) == ["a", "<", "b"]


def test_empty_stop_string_is_refused():
    with pytest.raises(CandleError, match="non-empty"):
        StopStringMatcher([""])
