"""The request fields OpenAI's clients send, against `candle-web serve --api` on loopback with
real models (SmolLM2-135M-Instruct, whisper-tiny.en, all-MiniLM-L6-v2), driven by the `openai`
package (and langchain's OpenAIEmbeddings): a fresh seed per request (reported, so an answer
can be reproduced), n choices, logprobs, max_tokens, embeddings' limit / token arrays /
dimensions, transcriptions' word timings / streaming / language, and model aliases. Each answer
is compared with the package's own pipelines run alone (what the CLI runs)."""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")
pytest.importorskip("starlette", reason="the serve extra installs starlette")

from tests.api.api_testlib import (BERT, CLIP, HTTP_TIMEOUT_S, LLM, QUESTION, WHISPER,  # noqa: E402
                                   Stream, api_server, chat_messages, post_json, reference_chat,
                                   reference_transcript)

ALIAS = "whisper-1"
SLOTS = 4
# Log-probabilities are float64 log-softmax of the same float32 logits on both sides (the
# batched step gives each row its logits bit for bit as alone): they differ only by the
# order of float64 sums, ~1e-13; one float32 ulp of a logit (~1e-6) would show.
LOGPROB_TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def pool():
    from candle_web.api import ModelPool

    pool = ModelPool(parallel=SLOTS, queue_size=8)
    for name in (LLM, WHISPER, BERT):
        pool.add(name)
    pool.add_alias(ALIAS, WHISPER)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def server_url(pool, tmp_path_factory):
    with api_server(pool, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module")
def client(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0,
                         timeout=HTTP_TIMEOUT_S)


def _error(caught) -> dict:
    """The error object of an APIStatusError (the openai client unwraps {"error": ...})."""
    return caught.value.body


# -- sampling ---------------------------------------------------------------------------------

def test_without_a_seed_each_request_samples_afresh_and_says_its_seed(client, pool, llama):
    answers = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=LLM, messages=chat_messages(), temperature=1.2, max_tokens=12)
        answers.append((int(raw.headers["x-candle-web-seed"]), raw.parse()))
    seeds = [seed for seed, _ in answers]
    texts = [answer.choices[0].message.content for _, answer in answers]
    assert len(set(seeds)) == 3
    # Three 12-token samples at temperature 1.2 agreeing by chance is far below 1e-6.
    assert len(set(texts)) > 1, texts
    # The reported seed reproduces the answer, and it is what `generate --seed` gives.
    again = client.chat.completions.create(model=LLM, messages=chat_messages(), temperature=1.2,
                                           max_tokens=12, seed=seeds[0])
    assert again.choices[0].message.content == texts[0]
    assert texts[0] == reference_chat(pool, llama, temperature=1.2, seed=seeds[0],
                                      max_new_tokens=12).text


def _alone_logprobs(pool, llama, prompt_ids: list, token_ids: list) -> list:
    """log-softmax (torch, float64) of the logits the model gives each generated token when
    the sequence runs alone: its prompt in one pass, then one step per token (generate's
    path)."""
    import torch

    from candle_web.generation import CausalLM

    loaded, _ = llama
    lm = CausalLM(loaded.model)
    rows = []
    with pool.compute:
        lm.reset(len(prompt_ids) + len(token_ids))
        logits = lm.start([prompt_ids])
        for token in token_ids:
            rows.append(torch.log_softmax(torch.from_numpy(
                np.asarray(logits[0], dtype=np.float64)), dim=-1).numpy())
            logits = lm.step(np.asarray([token]))
    return rows


def _chat_prompt_ids(llama, question: str) -> list:
    loaded, template = llama
    return list(loaded.tokenizer.encode(template.render(chat_messages(question)),
                                        add_special_tokens=False).ids)


def test_chat_logprobs_are_those_of_the_sequence_alone_while_batched(client, pool, llama):
    questions = [QUESTION, "Name three primary colours."]

    def ask(question):
        return client.chat.completions.create(
            model=LLM, messages=chat_messages(question), temperature=0, max_tokens=10,
            logprobs=True, top_logprobs=3)

    with concurrent.futures.ThreadPoolExecutor(2) as threads:  # two rows of one batch
        answers = list(threads.map(ask, questions))
    for question, answer in zip(questions, answers):
        choice = answer.choices[0]
        content = choice.logprobs.content
        ids = answer.model_extra["token_ids"]
        assert len(content) == len(ids)
        assert "".join(entry.token for entry in content) == choice.message.content
        expected = _alone_logprobs(pool, llama, _chat_prompt_ids(llama, question), ids)
        for entry, token, row in zip(content, ids, expected):
            assert bytes(entry.bytes).decode("utf-8") == entry.token
            assert abs(entry.logprob - row[token]) < LOGPROB_TOLERANCE
            # greedy: the token is the most likely one; the top 3 in decreasing order
            best = np.sort(row)[::-1][:3]
            assert [top.logprob for top in entry.top_logprobs] == pytest.approx(
                best, abs=LOGPROB_TOLERANCE)
            assert entry.top_logprobs[0].token == entry.token


def test_completion_logprobs_name_tokens_offsets_and_alternatives(client, pool, llama):
    prompt = "The capital of France is"
    answer = client.completions.create(model=LLM, prompt=prompt, temperature=0, max_tokens=6,
                                       logprobs=2)
    choice = answer.choices[0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i]))
                                    for i in range(len(logprobs.tokens))]
    loaded, _ = llama
    prompt_ids = list(loaded.tokenizer.encode(prompt, add_special_tokens=True).ids)
    ids = answer.model_extra["token_ids"]
    for value, top, token, row in zip(logprobs.token_logprobs, logprobs.top_logprobs, ids,
                                      _alone_logprobs(pool, llama, prompt_ids, ids)):
        assert abs(value - row[token]) < LOGPROB_TOLERANCE
        assert sorted(top.values(), reverse=True) == pytest.approx(
            np.sort(row)[::-1][:2], abs=LOGPROB_TOLERANCE)


def test_n_choices_sample_with_seed_plus_their_index(client, pool, llama):
    seed = 1234
    answer = client.chat.completions.create(model=LLM, messages=chat_messages(), n=3, seed=seed,
                                            temperature=1.0, max_tokens=10)
    texts = [choice.message.content for choice in answer.choices]
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    expected = [reference_chat(pool, llama, temperature=1.0, seed=seed + index,
                               max_new_tokens=10) for index in range(3)]
    assert texts == [reference.text for reference in expected]
    assert answer.usage.completion_tokens == sum(len(r.token_ids) for r in expected)
    # streamed, with logprobs: each choice's pieces by index, the same texts
    pieces, logprobs = {}, {}
    for chunk in client.chat.completions.create(
            model=LLM, messages=chat_messages(), n=3, seed=seed, temperature=1.0,
            max_tokens=10, logprobs=True, stream=True):
        for choice in chunk.choices:
            pieces.setdefault(choice.index, []).append(choice.delta.content or "")
            if choice.logprobs is not None:
                logprobs.setdefault(choice.index, []).extend(choice.logprobs.content)
    assert ["".join(pieces[index]) for index in range(3)] == texts
    assert [len(logprobs[index]) for index in range(3)] == [len(r.token_ids) for r in expected]


def test_n_is_refused_above_the_slots_and_above_the_free_ones(client, server_url):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=LLM, messages=chat_messages(), n=SLOTS + 1)
    assert _error(caught)["param"] == "n"
    assert f"{SLOTS} parallel slots" in _error(caught)["message"]
    busy = Stream(server_url, "Write a long story about a dragon.", max_tokens=500)
    try:
        assert busy.response.status == 200
        next(busy.events())  # its slot is taken
        status, headers, body = post_json(server_url, "/v1/chat/completions", {
            "model": LLM, "messages": chat_messages(), "n": SLOTS, "max_tokens": 4})
        assert status == 429, body[:300]
        assert json.loads(body)["error"]["param"] == "n"
        assert "Retry-After" in headers or "retry-after" in headers
    finally:
        busy.hang_up()


def test_max_tokens_zero_is_refused_and_the_default_is_the_context_remainder(client):
    from candle_web.api import sampling_fields

    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=LLM, messages=chat_messages(),
                                           **{field: 0})
        assert _error(caught)["param"] == field
    sampling = sampling_fields.parse({}, context=100, prompt_tokens=30, chat=True, parallel=4)
    assert (sampling.max_tokens, sampling.budget) == (70, 70)
    with pytest.raises(Exception) as caught:
        sampling_fields.parse({"top_logprobs": 2}, 100, 30, chat=True, parallel=4)
    assert caught.value.param == "top_logprobs"


# -- embeddings -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedder(pool):
    """The pipeline's embedder (what `candle-web embed` runs) on its own copy of the model."""
    from candle_web.pipelines import load_bert
    from candle_web.pipelines.embed import SentenceEmbedder

    loaded = load_bert(BERT)
    return SentenceEmbedder(loaded.model, loaded.tokenizer)


LONG_TEXT = " ".join(f"sentence {i} of a long document about rivers." for i in range(60))


def test_embeddings_refuse_a_long_input_unless_truncation_is_asked(client, pool, embedder):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=BERT, input=["short", LONG_TEXT])
    error = _error(caught)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input[1]")
    assert "maximum context length is 128 tokens" in error["message"]
    answer = client.embeddings.create(model=BERT, input=LONG_TEXT, extra_body={"truncate": True})
    with pytest.warns(UserWarning, match="truncated"), pool.compute:
        expected = embedder.embed([LONG_TEXT])
    # the same 128 ids through the same float32 model, alone on both sides
    assert np.array_equal(np.asarray(answer.data[0].embedding, np.float32), expected.vectors[0])
    assert answer.usage.prompt_tokens == 128


def test_embeddings_take_token_arrays_and_refuse_other_dimensions(client, embedder):
    text = "A man is eating food."
    ids = list(embedder.tokenizer.encode(text, add_special_tokens=False).ids)
    by_text = client.embeddings.create(model=BERT, input=text).data[0].embedding
    by_ids = client.embeddings.create(model=BERT, input=ids).data[0].embedding
    assert by_ids == by_text
    both = client.embeddings.create(model=BERT, input=[ids, ids], dimensions=384)
    assert [item.embedding for item in both.data] == [by_text, by_text]
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=BERT, input=[[1, 2, 40000]])
    assert _error(caught)["param"] == "input[0]" and "vocabulary" in _error(caught)["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=BERT, input=text, dimensions=128)
    assert _error(caught)["param"] == "dimensions"
    assert "384-dimensional" in _error(caught)["message"]


def test_langchain_embeddings_chunk_a_long_document_under_the_limit(server_url, pool, embedder):
    """langchain's OpenAIEmbeddings sends cl100k token arrays by default (tiktoken, whose
    table is downloaded, so not offline); for a model of another vocabulary it is told the
    model's own tokenizer (transformers, offline from the model folder): it cuts a long
    document into pieces under the model's limit and averages their vectors."""
    pytest.importorskip("langchain_openai", reason="the dev extra installs langchain-openai")
    pytest.importorskip("transformers", reason="the dev extra installs transformers")
    from langchain_openai import OpenAIEmbeddings

    from candle_web import hub

    folder = next((hub.cache_dir() / "models--sentence-transformers--all-MiniLM-L6-v2"
                   / "snapshots").iterdir())
    # 126 content tokens: with [CLS] and [SEP], the model's 128.
    embeddings = OpenAIEmbeddings(model=BERT, base_url=server_url + "/v1", api_key="unused",
                                  tiktoken_enabled=False, tiktoken_model_name=str(folder),
                                  embedding_ctx_length=126, max_retries=0)
    short, long = embeddings.embed_documents(["A man is eating food.", LONG_TEXT])
    with pool.compute:
        expected = embedder.embed(["A man is eating food."]).vectors[0]
    assert np.allclose(short, expected, atol=1e-6)  # float32 vectors through JSON floats
    assert len(long) == 384 and abs(np.linalg.norm(long) - 1) < 1e-5


# -- audio ----------------------------------------------------------------------------------

def test_word_timestamps_are_the_clis(client, pool, whisper):
    from candle_web.cli import build_parser
    from candle_web.io.audio import load_audio
    from candle_web.pipelines.transcribe import options_from_args, transcribe

    with CLIP.open("rb") as audio:
        answer = client.audio.transcriptions.create(
            model=WHISPER, file=audio, response_format="verbose_json",
            timestamp_granularities=["word", "segment"])
    options = options_from_args(build_parser().parse_args(
        ["transcribe", str(CLIP), "--word-timestamps"]))
    with pool.compute:
        expected = transcribe(whisper.model, whisper.tokenizer, load_audio(str(CLIP)), options)
    words = [(w.word.strip(), w.start, w.end) for s in expected.segments for w in s.words]
    assert [(w.word, w.start, w.end) for w in answer.words] == words
    assert len(words) >= 5
    assert [s.text for s in answer.segments] == [s.text for s in expected.segments]
    with pytest.raises(openai.BadRequestError) as caught:
        with CLIP.open("rb") as audio:
            client.audio.transcriptions.create(model=WHISPER, file=audio,
                                               timestamp_granularities=["word"])
    assert _error(caught)["param"] == "timestamp_granularities"


def test_streamed_transcript_through_an_alias(client, pool, whisper):
    with CLIP.open("rb") as audio:
        events = list(client.audio.transcriptions.create(model=ALIAS, file=audio, stream=True))
    assert [event.type for event in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done"
    expected = reference_transcript(pool, whisper, CLIP).text
    assert events[-1].text == expected
    assert "".join(event.delta for event in events[:-1]).strip() == expected.strip()
    listed = {model.id: model for model in client.models.list().data}
    assert listed[ALIAS].model_extra["alias_of"] == WHISPER


def test_a_language_an_english_only_model_cannot_do_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        with CLIP.open("rb") as audio:
            client.audio.transcriptions.create(model=WHISPER, file=audio, language="fr")
    assert _error(caught)["param"] == "language"
    assert "English-only" in _error(caught)["message"]


def test_serve_parses_aliases():
    from candle_web.cli import build_parser

    args = build_parser().parse_args(["serve", "--api", "--alias", f"{ALIAS}={WHISPER}"])
    assert args.alias == [(ALIAS, WHISPER)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--alias", "whisper-1"])
