"""Fixtures of the batch tests: a two-node Ray cluster on this machine (batch_testlib.LocalCluster),
the clips (clips_testlib.py), and the single-file command's answers for them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


from tests.batch.batch_testlib import RAY, LocalCluster, cli_env  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    if not RAY.exists():
        pytest.fail("Ray is not installed in this environment: `make setup` installs the dev "
                    "extra, which includes candle-web[cluster]", pytrace=False)
    cluster = LocalCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def clip_set(tmp_path_factory):
    from candle_web import hub

    from tests.batch.clips_testlib import make_clips

    speech = hub.cache_dir() / "testdata" / "speech"
    if not (speech / "librivox").is_dir():
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)")
    return make_clips(speech, tmp_path_factory.mktemp("batch-inputs"))


@pytest.fixture(scope="module")
def cli_started(clip_set, tmp_path_factory):
    """`candle-web transcribe --format json` on the good clips, started now so that it runs
    while the cluster comes up (one call per folder: the CLI names its outputs by file stem)."""
    by_folder: dict[Path, list[str]] = {}
    for path in clip_set["good"]:
        by_folder.setdefault(Path(path).parent, []).append(path)
    calls = []
    for index, (folder, paths) in enumerate(sorted(by_folder.items())):
        out = tmp_path_factory.mktemp(f"cli-{index}")
        process = subprocess.Popen([sys.executable, "-m", "candle_web.cli", "transcribe", *paths,
                                    "--format", "json", "--output-dir", str(out)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=cli_env())
        calls.append((process, out, paths))
    yield calls
    for process, _, _ in calls:
        if process.poll() is None:
            process.kill()


@pytest.fixture(scope="module")
def cli_transcripts(cli_started):
    """path -> the single-file command's answer for each good clip."""
    answers = {}
    for process, out, paths in cli_started:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        for path in paths:
            answers[path] = json.loads((out / f"{Path(path).stem}.json").read_text())
    return answers
