"""The short, bounded fuzz run of `make test`: every parser, SHORT_CASES mutated real files.

Each case must return or raise a CandleError; an untyped exception, a case running past
CASE_SECONDS, a MemoryError under the 2 GiB cap, or a crashed child fails the parser's test,
listing every finding with its code site, the saved input and the command that replays it.
The run seed is fixed, so a failure here reproduces exactly; `make fuzz` (tests/fuzz/harness.py)
runs the same targets for a stated time instead.
"""

from __future__ import annotations

import pytest

from tests.fuzz import seeds_testlib
from tests.fuzz import targets_testlib
from tests.fuzz import harness

pytestmark = pytest.mark.fuzz

SHORT_CASES = 250
RUN_SEED = 0
CASE_SECONDS = harness.DEFAULT_CASE_SECONDS
FINDINGS = harness.DEFAULT_FINDINGS / "make-test"


@pytest.fixture(scope="module")
def pool():
    """One fuzzing child for the whole file (it is replaced after any hang or crash)."""
    children = harness.ChildPool(harness.DEFAULT_MEMORY_BYTES)
    yield children
    children.close()


def describe_findings(report: harness.TargetReport) -> str:
    lines = [f"{report.target}: {sum(g.count for g in report.groups.values())} of "
             f"{report.cases} cases failed"]
    for group in sorted(report.groups.values(), key=lambda g: -g.count):
        lines.append(f"  {group.kind} {group.type} at {group.site} ({group.count} cases): "
                     f"{group.message[:200]!r}")
        for path in group.saved[:1]:
            lines.append(f"    saved: {path}")
            lines.append(f"    replay: {harness.replay_command(report.target, path)}")
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(targets_testlib.TARGETS))
def test_parser_survives_mutated_real_files(name, pool):
    target = targets_testlib.TARGETS[name]
    seeds = harness.seeds_for(target)
    if not seeds:
        pytest.fail(f"no seed files for {name}: the model cache lacks "
                    f"{sorted(seeds_testlib.missing)}; run `make test` (or python models/fetch.py "
                    f"--default)", pytrace=False)
    settings = harness.Settings(cases=SHORT_CASES, run_seed=RUN_SEED, case_seconds=CASE_SECONDS,
                                findings=FINDINGS)
    report = harness.fuzz_target(target, seeds, settings, pool)
    assert report.cases == SHORT_CASES
    if report.groups:
        pytest.fail(describe_findings(report), pytrace=False)
