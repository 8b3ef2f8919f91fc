"""models/fetch.py: fetches with a progress bar, is idempotent, --verify catches corruption."""

from __future__ import annotations

import importlib.util
import io
import json
import os
from pathlib import Path

import pytest

from tests.hub.hub_testlib import REVISION, file_entry, registry_data

FETCH_SCRIPT = Path(__file__).resolve().parents[2] / "models" / "fetch.py"
BODY = b"0123456789" * 50_000
REPO = "test-org/cli-model"


@pytest.fixture(scope="module")
def fetch_cli():
    spec = importlib.util.spec_from_file_location("candle_web_fetch_cli", FETCH_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def registry_file(tmp_path, fake_hub):
    fake_hub.add(REPO, REVISION, "w.bin", BODY)
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(registry_data(
        "cli-model", [file_entry("w.bin", BODY)],
        [{"hf": {"repo": REPO, "revision": REVISION}}])))
    return path


def test_fetch_then_cached_then_verify(fetch_cli, registry_file, cache, fake_hub, capsys):
    assert fetch_cli.main(["--registry", str(registry_file), "cli-model"]) == 0
    err = capsys.readouterr().err
    assert "100.0%" in err and "cli-model: fetched, 1 files" in err
    assert f"from {fake_hub.url}/{REPO}/resolve/{REVISION}/w.bin" in err
    cached = cache / "models--test-org--cli-model" / "snapshots" / REVISION / "w.bin"
    assert cached.read_bytes() == BODY

    requests = len(fake_hub.requests)
    assert fetch_cli.main(["--registry", str(registry_file), "cli-model"]) == 0
    assert "cli-model: cached" in capsys.readouterr().err
    assert len(fake_hub.requests) == requests

    # Corrupt in place, keeping size and mtime (ctime still changes, so a plain fetch would
    # re-hash it too): --verify re-hashes, re-fetches and still reports failure so that a
    # damaged cache is noticed.
    stat = cached.stat()
    with open(cached, "r+b") as handle:
        handle.write(b"!")
    os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fetch_cli.main(["--registry", str(registry_file), "--verify", "cli-model"]) == 1
    assert "w.bin corrupt" in capsys.readouterr().err
    assert cached.read_bytes() == BODY
    assert fetch_cli.main(["--registry", str(registry_file), "--verify", "cli-model"]) == 0


def test_offline_missing_and_usage(fetch_cli, registry_file, cache, capsys):
    assert fetch_cli.main(["--registry", str(registry_file), "--offline", "cli-model"]) == 1
    assert "skipped (CANDLE_WEB_OFFLINE=1)" in capsys.readouterr().err
    assert fetch_cli.main(["--registry", str(registry_file), "--cache-only", "cli-model"]) == 1
    assert "skipped (cache only)" in capsys.readouterr().err
    assert fetch_cli.main(["--registry", str(registry_file)]) == 2
    assert fetch_cli.main(["--registry", str(registry_file), "no-such-model"]) == 1
    assert fetch_cli.main(["--registry", str(registry_file), "--list"]) == 0
    assert "cli-model" in capsys.readouterr().out


def test_progress_bar_draws_a_line_per_file():
    from_script = importlib.util.spec_from_file_location("fetch_for_bar", FETCH_SCRIPT)
    module = importlib.util.module_from_spec(from_script)
    from_script.loader.exec_module(module)
    stream = io.StringIO()
    bar = module.ProgressBar(stream)
    bar(0, 2_000_000, "a.bin")
    bar(1_000_000, 2_000_000, "a.bin")  # within the redraw interval: skipped
    bar(2_000_000, 2_000_000, "a.bin")
    bar(5, None, "b.json")
    text = stream.getvalue()
    assert text.count("\n") == 1 and "100.0%" in text and "2.0/2.0 MB" in text
    assert text.endswith("0.0 MB ...")
