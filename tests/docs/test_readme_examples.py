"""The README's examples run as written: every snippet of the cheat sheet's candle-web column,
every Python code block, and every `candle-web ...` line of the shell blocks parses with the real
command line (so an option the docs show cannot disappear unnoticed)."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import candle_web as cw

README = Path(__file__).resolve().parents[2] / "README.md"
CHEAT_SHEET_HEADING = "## Cheat sheet"
CANDLE_WEB_COLUMN = 2  # | name | Candle (Rust) | candle-web | PyTorch |
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`]+)`")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def cheat_sheet_rows() -> list[tuple[str, list[str]]]:
    """(row name, the candle-web column's code snippets) for each row of the cheat sheet."""
    text = readme()
    table = text[text.index(CHEAT_SHEET_HEADING):]
    rows = []
    for line in table.splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if cells[0] == "":  # the header row
            continue
        rows.append((cells[0], INLINE_CODE.findall(cells[CANDLE_WEB_COLUMN])))
    return rows


def cuda_present() -> bool:
    try:
        cw.Tensor([1.0]).to_device(cw.Device.cuda(0))
    except cw.CandleError:
        return False
    return True


@pytest.fixture
def namespace(tmp_path, monkeypatch):
    """What the cheat sheet's snippets assume is at hand: `cw` and the names it imports, a
    2x4 tensor `t`, same-shape `a`/`b`, a `Var` `w` with a `loss`, a tensor `map` to save and a
    `vb` over saved weights of size `d`. The snippets write into a temporary folder."""
    monkeypatch.chdir(tmp_path)
    from candle_web.io import safetensors
    from candle_web.nn import VarBuilder

    d = 3
    path = tmp_path / "encoder.safetensors"
    safetensors.save({"encoder.weight": cw.Tensor.ones((d, d), cw.f32)}, str(path))
    w = cw.Var(cw.Tensor([[1.0, 2.0], [3.0, 4.0]]))
    return {
        "cw": cw, "Tensor": cw.Tensor, "Device": cw.Device, "Var": cw.Var,
        "t": cw.Tensor.arange(0, 8).to_dtype(cw.f32).reshape(2, 4),
        "a": cw.Tensor([[1.0, 2.0], [3.0, 4.0]]), "b": cw.Tensor([[5.0, 6.0], [7.0, 8.0]]),
        "w": w, "loss": (w * w).sum_all(),
        "map": {"weight": cw.Tensor([[1.0, 2.0], [3.0, 4.0]])},
        "vb": VarBuilder.from_safetensors([str(path)]), "d": d,
    }


def test_the_cheat_sheet_is_found_whole():
    names = [name for name, _ in cheat_sheet_rows()]
    assert names[:3] == ["create", "zeros", "random"] and "weights by name" in names
    assert all(snippets for _, snippets in cheat_sheet_rows()), "a row shows no candle-web code"


@pytest.mark.parametrize("row", [name for name, _ in cheat_sheet_rows()])
def test_cheat_sheet_snippet_runs(row, namespace):
    snippets = dict(cheat_sheet_rows())[row]
    if row == "load":  # the save row's file, written here first
        exec(compile(dict(cheat_sheet_rows())["save"][0], "README save", "exec"), namespace)
    for snippet in snippets:
        code = compile(snippet, f"README cheat sheet, {row}: {snippet}", "exec")
        if row == "device" and not cuda_present():
            # Without a GPU the snippet must fail with the typed error that names what is
            # missing, not with an AttributeError from a renamed API.
            with pytest.raises(cw.CandleError):
                exec(code, namespace)
            continue
        exec(code, namespace)


def test_cheat_sheet_results_are_what_the_pytorch_column_says(namespace):
    """A few rows checked for their values, not only for running."""
    run = lambda snippet: eval(snippet, namespace)  # noqa: E731
    assert run("Tensor([[1., 2.], [3., 4.]])").to_list() == [[1.0, 2.0], [3.0, 4.0]]
    assert run("Tensor.arange(0, 6)").to_list() == list(range(6))
    assert run("t[:, 1:3]").to_list() == [[1.0, 2.0], [5.0, 6.0]]
    assert run("t.sum_keepdim(1)").to_list() == [[6.0], [22.0]]
    assert run("t.reshape(2, -1)").dims() == (2, 4)
    g = run("loss.backward()")
    np.testing.assert_allclose(g[namespace["w"]].to_numpy(), [[2.0, 4.0], [6.0, 8.0]])
    exec("cw.io.safetensors.save(map, 'w.safetensors')", namespace)
    loaded = run("cw.io.safetensors.load('w.safetensors')")
    assert loaded["weight"].to_list() == [[1.0, 2.0], [3.0, 4.0]]
    assert run('vb.pp("encoder").get((d, d), "weight")').dims() == (3, 3)


def python_blocks() -> list[str]:
    return [body for language, body in FENCE.findall(readme()) if language in ("python", "py")]


def test_the_python_blocks_are_found():
    assert len(python_blocks()) >= 2


# The API example talks to `candle-web serve --api` at its default address; the test runs it
# against a real server on a free loopback port with the two models it names.
README_API_URL = "http://127.0.0.1:8000/v1"


@contextlib.contextmanager
def api_server(models):
    from candle_web.serve import build_api, start_in_thread

    app, pool = build_api(models)
    server, url = start_in_thread(api=app)
    try:
        yield url.rstrip("/") + "/v1"
    finally:
        server.shutdown()
        server.server_close()
        pool.close()


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_code_block_runs(index, tmp_path, monkeypatch, capsys):
    """Each block runs in a fresh namespace, in a folder holding the `clip.wav` the blocks
    name (a real LibriVox recording); what it prints is checked where the answer is known."""
    from candle_web import hub

    speech = hub.cache_dir() / "testdata" / "speech" / "librivox"
    clip = speech / "sense_and_sensibility_01_austen_64kb-0870.wav"
    if not clip.is_file():
        pytest.fail(f"test speech missing in {speech}: run `make test`", pytrace=False)
    (tmp_path / "clip.wav").write_bytes(clip.read_bytes())
    monkeypatch.chdir(tmp_path)
    block = python_blocks()[index]
    if README_API_URL in block:
        with api_server(("smollm2-135m-instruct", "whisper-tiny.en")) as url:
            block = block.replace(README_API_URL, url)
            exec(compile(block, f"README python block {index}", "exec"), {})
    else:
        exec(compile(block, f"README python block {index}", "exec"), {})
    printed = capsys.readouterr().out.lower()
    if "load_whisper" in block:
        # The recording's words (librivox/transcription: "... mister john dashwood had then
        # leisure to consider ..."): the model must have heard them.
        assert "john dashwood had then leisure to consider" in printed, printed
    if "capital of france" in block.lower():
        assert "paris" in printed, printed


def candle_web_command_lines() -> list[str]:
    lines = []
    for language, body in FENCE.findall(readme()):
        if language not in ("sh", "bash", "console", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():  # a command continued with \
            command = line.split("#", 1)[0].strip()
            if command.startswith("candle-web "):
                lines.append(command)
    return lines


def test_the_command_line_block_is_found():
    assert any(line.startswith("candle-web transcribe") for line in candle_web_command_lines())


@pytest.mark.parametrize("line", candle_web_command_lines())
def test_shell_example_parses_with_the_real_command_line(line):
    from candle_web import cli

    argv = shlex.split(line)[1:]
    args = cli.build_parser().parse_args(argv)  # argparse exits (SystemExit) on a bad option
    assert args.command == argv[0]
