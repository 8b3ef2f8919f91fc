"""The fuzz tests' marker (pyproject's --strict-markers needs every marker declared)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fuzz: bounded fuzzing of the file parsers with mutated real files "
        "(tests/fuzz/harness.py; `make fuzz` runs the same targets for longer)")
