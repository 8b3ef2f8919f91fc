"""Fixtures of the API tests: the references' own models, loaded apart from the server's.

Each module defines `pool` (its ModelPool); these fixtures take it so that the references are
loaded after the server's models, as each module's tests expect."""

from __future__ import annotations

import pytest

from tests.api.api_testlib import LLM, WHISPER


@pytest.fixture(scope="module")
def llama(pool):
    from candle_web.generation.chat_templates import chat_template_for
    from candle_web.pipelines import load_llama

    loaded = load_llama(LLM)
    return loaded, chat_template_for(loaded.model, loaded.tokenizer)


@pytest.fixture(scope="module")
def whisper(pool):
    from candle_web.pipelines import load_whisper

    return load_whisper(WHISPER)
