"""The fuzz harness itself: it must be able to fail, and its cases must be reproducible.

Deliberately broken targets (targets_testlib.BROKEN_TARGETS) must come back as an untyped
exception, a hang (a sleep, and a hang inside re's C code, where no signal handler runs), an
allocation beyond the bound and a crash, each within the per-case limit, naming the code site.
"""

from __future__ import annotations

import json
import resource
import time

import pytest

from tests.fuzz import targets_testlib
from tests.fuzz import harness
from tests.fuzz.mutators_testlib import Seed, boundary_value, case_rng, dump_json, mutate, mutate_json_text

pytestmark = pytest.mark.fuzz

# Short, so that proving a hang is caught costs little; the real runs use 10 s.
CASE_SECONDS = 1.5
# A hung child is killed and a new one started (numpy + candle_web imports): allow for that.
RESTART_SLACK_SECONDS = 10.0


def run_broken(name: str, cases: int, tmp_path) -> harness.TargetReport:
    target = targets_testlib.BROKEN_TARGETS[name]
    settings = harness.Settings(cases=cases, case_seconds=CASE_SECONDS, findings=tmp_path)
    pool = harness.ChildPool(harness.DEFAULT_MEMORY_BYTES)
    try:
        return harness.fuzz_target(target, harness.broken_target_seeds(), settings, pool)
    finally:
        pool.close()


def only_group(report: harness.TargetReport) -> harness.Group:
    assert len(report.groups) == 1, report.groups
    return next(iter(report.groups.values()))


def test_untyped_exception_is_a_finding_and_a_candle_error_is_not(tmp_path):
    report = run_broken("broken.key-error", 40, tmp_path)
    group = only_group(report)
    assert (group.kind, group.type) == ("untyped", "KeyError")
    assert "targets_testlib.py" in group.site and "broken_key_error" in group.site
    assert report.passed["typed"] > 0  # the FormatError cases passed
    assert group.count + report.passed["typed"] == report.cases
    saved = group.saved[0]
    assert saved.exists() and saved.with_suffix(".txt").exists()
    before = resource.getrlimit(resource.RLIMIT_AS)
    assert harness.replay("broken.key-error", saved, harness.DEFAULT_MEMORY_BYTES) == 1
    # The cap applies to the replaying child only: this process runs the rest of the suite.
    assert resource.getrlimit(resource.RLIMIT_AS) == before


@pytest.mark.parametrize("name, site", [("broken.hang", "broken_hang"),
                                        ("broken.regex-hang", "broken_regex_hang")])
def test_hang_is_killed_at_the_limit(name, site, tmp_path):
    started = time.monotonic()
    report = run_broken(name, 2, tmp_path)
    elapsed = time.monotonic() - started
    group = only_group(report)
    assert group.kind == "hang" and group.count == 2
    assert site in group.site  # from faulthandler's dump just before the kill
    assert elapsed < 2 * CASE_SECONDS + RESTART_SLACK_SECONDS


def test_allocation_beyond_the_bound_is_a_memory_finding(tmp_path):
    started = time.monotonic()
    report = run_broken("broken.allocation", 2, tmp_path)
    group = only_group(report)
    assert group.kind == "memory" and group.count == 2
    assert "MemoryError" in group.type and "broken_allocation" in group.site
    assert time.monotonic() - started < 2 * CASE_SECONDS + RESTART_SLACK_SECONDS


def test_crash_is_a_finding(tmp_path):
    report = run_broken("broken.crash", 2, tmp_path)
    group = only_group(report)
    assert group.kind == "crash" and group.count == 2
    assert "broken_crash" in group.site


def test_command_line_exits_non_zero_and_prints_the_replay(tmp_path, capsys):
    status = harness.main(["--targets", "broken.key-error", "--cases", "20",
                           "--findings", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1
    assert "untyped  KeyError" in out and "--replay broken.key-error" in out


def test_cases_are_deterministic_and_differ_from_each_other():
    seeds = [Seed("json", b'{"a": [1, 2, {"b": "c"}], "d": 4}', json_span=(0, 33)),
             Seed("bytes", bytes(range(64)) * 4, header_end=32)]
    first = [mutate(case_rng(7, "t", case), seeds) for case in range(50)]
    again = [mutate(case_rng(7, "t", case), seeds) for case in range(50)]
    assert first == again
    assert len({data for _, data in first}) > 40


def test_json_mutations_reach_what_json_dumps_cannot_write():
    """Duplicate keys, deep nesting and 400-digit numbers come through as raw text."""
    texts = [mutate_json_text(case_rng(0, "json", case), b'{"a": {"b": 1, "c": [2]}}')
             for case in range(400)]
    assert any(b"[[[[[[[[[[" in t or b'{"a":{"a":' in t for t in texts)
    assert any(b"0" * 300 in t or b"9" * 300 in t for t in texts)
    assert any(t.count(b'"b"') == 2 or t.count(b'"c"') == 2 for t in texts)
    assert json.loads(dump_json({"x": [1, "y"]}, [])) == {"x": [1, "y"]}


def test_boundary_values_fit_their_field():
    values = {boundary_value(case_rng(0, "int", case), 5, 2) for case in range(200)}
    assert values <= set(range(1 << 16)) and {0, 1, 0xFFFF} <= values
