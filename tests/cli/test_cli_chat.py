"""`candle-web chat` driven through a pseudo-terminal (pexpect), as a user types: two turns where
the second reuses the first's cache and answers as the in-process Conversation does (the same
greedy text), Ctrl-C during an answer (the program stays, the partial answer is kept), /system,
/save, /reset, /load, a bad /load, and Ctrl-D to exit with status 0."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.signals_testlib import default_sigint

REPO_ROOT = Path(__file__).resolve().parents[1]

pexpect = pytest.importorskip("pexpect", reason="pexpect (the dev extra) drives the terminal chat")

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a helpful assistant."
WAIT = 240  # seconds for one load or answer on a loaded 2-core machine (a hang fails, not a pace)
# Long enough that Ctrl-C lands while the dragon story streams even on a loaded machine (a
# 40-token story takes ~2 s); the other turns end at EOS well before it.
MAX_TOKENS = 160
STATUS = re.compile(r"\[prompt: (\d+) new tokens, (\d+) reused; (\d+) generated[^;]*; (\w+)\]")


@pytest.fixture
def terminal(tmp_path):
    env = dict(os.environ, CANDLE_WEB_OFFLINE="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(str(REPO_ROOT / p) for p in ("pkg", "native")),
               TERM="dumb")
    child = pexpect.spawn(sys.executable, ["-m", "candle_web.cli", "chat", "--model", MODEL,
                                           "--system", SYSTEM, "--max-tokens", str(MAX_TOKENS)],
                          cwd=str(tmp_path), env=env, encoding="utf-8", timeout=WAIT,
                          dimensions=(50, 400), preexec_fn=default_sigint)
    child.expect("chat with a context of")
    child.expect_exact("> ")
    yield child
    if child.isalive():
        child.terminate(force=True)


def ask(child, text: str) -> tuple:
    """Send a line; (answer text, new, reused, generated, stop reason) once the prompt is back."""
    child.sendline(text)
    child.expect_exact(text)  # the echo of the typed line
    child.expect(STATUS)
    answer = child.before.replace("\r\n", "\n").strip()
    new, reused, generated, reason = child.match.groups()
    child.expect_exact("> ")
    return answer, int(new), int(reused), int(generated), reason


def in_process_answers(turns: list) -> list:
    from candle_web.generation import GenerationOptions
    from candle_web.generation.conversation import Conversation
    from candle_web.pipelines import load_llama

    loaded = load_llama(MODEL)
    chat = Conversation(loaded.model, loaded.tokenizer, system=SYSTEM)
    options = GenerationOptions(max_new_tokens=MAX_TOKENS, add_special_tokens=False)
    return [chat.send(text, options).text.strip() for text in turns]


def test_terminal_chat_turns_ctrl_c_commands_and_ctrl_d(terminal, tmp_path):
    child = terminal
    turns = ["My name is Ada. Say hello to me.", "What is my name?"]
    first = ask(child, turns[0])
    second = ask(child, turns[1])
    assert first[2] == 0 and first[4] in ("eos", "max_tokens")
    assert second[2] >= first[1] + first[3] - 1  # turn 1 (prompt and answer) was reused
    # The twin check: the terminal's answers are the in-process conversation's.
    assert [first[0], second[0]] == in_process_answers(turns)

    # Ctrl-C while an answer streams: the answer stops, the program stays.
    child.sendline("/system Answer at great length.")
    child.expect_exact("[system prompt set]")
    child.expect_exact("> ")
    child.sendline("Write a very long story about a dragon.")
    child.expect_exact("dragon.")
    child.expect(r"\w+\W+\w+\W+\w+")  # some words of the answer have streamed
    child.sendintr()
    child.expect(r"; cancelled\]|\[stopped\]")
    child.expect_exact("> ")
    after = ask(child, "Thank you.")
    assert after[2] > 0 and after[3] > 0  # the next turn runs, on the kept cache

    child.sendline("/save chat.json")
    child.expect_exact("[saved")
    child.expect_exact("> ")
    saved = json.loads((tmp_path / "chat.json").read_text())
    assert saved[0] == {"role": "system", "content": "Answer at great length."}
    assert [m["role"] for m in saved[1:]] == ["user", "assistant"] * 4
    assert saved[1]["content"] == turns[0] and saved[4]["content"] == second[0]

    child.sendline("/reset")
    child.expect_exact("[conversation cleared]")
    child.sendline("/load missing.json")
    child.expect("candle-web: /load missing.json")
    (tmp_path / "bad.json").write_text('[{"role": "robot", "content": "x"}]')
    child.sendline("/load bad.json")
    child.expect(r"bad.json\[0\].role: 'robot'")
    child.sendline("/load chat.json")
    child.expect_exact("[loaded 8 messages and a system prompt")
    child.expect_exact("> ")

    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
