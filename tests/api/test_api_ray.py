"""`candle-web serve --api --ray-address ...`: API replicas behind Ray Serve on the same kind of
local two-node cluster the batch tests start (tests/batch/batch_testlib.LocalCluster, loopback
only, stopped at the end). Eight chats at once spread over the two replicas (each takes at most
--parallel 2 at a time) and every answer equals the one made alone."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openai", reason="the dev extra installs the openai client")
pytest.importorskip("ray.serve", reason="the cluster extra installs ray[serve]")


from tests.batch.batch_testlib import RAY, LocalCluster, cli_env  # noqa: E402
from tests.api.api_testlib import HTTP_TIMEOUT_S, LLM, chat_messages, raw_request  # noqa: E402
from tests.signals_testlib import default_sigint  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "Say hello in Spanish."]
START_TIMEOUT_S = 600
TOKENS = 8


@pytest.fixture(scope="module")
def cluster():
    if not RAY.exists():
        pytest.skip("Ray is not installed: the cluster extra")
    cluster = LocalCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_replicas_behind_ray_serve_share_the_requests_with_the_same_answers(cluster):
    from candle_web.generation import GenerationOptions, generate
    from candle_web.generation.chat_templates import chat_template_for
    from candle_web.pipelines import load_llama

    loaded = load_llama(LLM)
    template = chat_template_for(loaded.model, loaded.tokenizer)
    alone = {q: generate(loaded.model, loaded.tokenizer, template.render(chat_messages(q)),
                         GenerationOptions(max_new_tokens=TOKENS, add_special_tokens=False))
             for q in QUESTIONS}

    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "candle_web.cli", "serve", "--api", "--ray-address",
         cluster.address, "--replicas", "2", "--parallel", "2", "--model", LLM,
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
        start_new_session=True, preexec_fn=default_sigint)
    try:
        url = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError(f"serve exited {process.returncode}: "
                                     f"{process.stderr.read()[-3000:]}")
            if line.startswith("candle-web: OpenAI-compatible API at "):
                url = line.split(" at ", 1)[1].split()[0].removesuffix("/v1")
        assert url == f"http://127.0.0.1:{port}", url

        answers = [None] * 8

        def ask(index: int) -> None:
            question = QUESTIONS[index % len(QUESTIONS)]
            status, headers, body = raw_request(url, "POST", "/v1/chat/completions", json.dumps({
                "model": LLM, "messages": chat_messages(question), "max_tokens": TOKENS,
                "temperature": 0}).encode(), {"Content-Type": "application/json"})
            answers[index] = (question, status, headers, body)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HTTP_TIMEOUT_S * 2)
        replicas = set()
        for question, status, headers, body in answers:
            assert status == 200, body[:500]
            answer = json.loads(body)
            assert answer["token_ids"] == alone[question].token_ids
            assert answer["choices"][0]["message"]["content"] == alone[question].text
            replicas.add(headers["x-candle-web-replica"])
        assert len(replicas) == 2, replicas  # both replicas answered
        status, _, body = raw_request(url, "GET", "/v1/models")
        assert status == 200 and LLM in {m["id"] for m in json.loads(body)["data"]}
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
