"""The Chat view end to end in headless Chromium, on the registry's SmolLM2-135M-Instruct Q4_1
and (the last test) Qwen2.5-Coder-0.5B-Instruct Q4_K_M.

A three-turn conversation where turn 2 depends on turn 1 (a name given in turn 1 is recalled);
regenerate and edit (turn 3 sent with the Enter key; Shift+Enter only breaks the line): their
ids equal those of the same conversation run natively and fresh by
generation.Conversation (the code `candle-web chat` runs: the twin check, greedy ids must be
equal). The page's wasm part has no `step_prompts`, so its steps do not split a prompt exactly:
no turn reuses the cached prefix (which could flip a near-tie) and the status line says so (the
reuse and its roll-backs are tested natively on numba, tests/generation/test_conversation.py);
a reload keeps the
conversation; HTML in an answer is inert; export and import as OpenAI messages JSON; the
overflow notice on a small context; New chat starts with an empty status line; a Qwen
conversation reloaded continues on Qwen. The page is this module's own (reloaded by tests).
"""
from __future__ import annotations

import json

import pytest

MODEL = "smollm2-135m-instruct"
SYSTEM = "Answer in one short sentence."
MAX_TOKENS = 24
# A turn on a busy 2-core machine: the model's first load (download, build) and a few tokens a
# second. A hang fails; the pace is not tested.
TURN_TIMEOUT_MS = 400_000

IDLE_STATUS = "Type a message and press Send (or Enter)."

pytestmark = pytest.mark.ui


# Later modules (test_generate) expect their first SmolLM2 load to download it: the models this
# one loads leave the model cache with it (conftest: model_cache_left_as_found).
@pytest.fixture(scope="module", autouse=True)
def _model_cache_left_as_found(model_cache_left_as_found):
    yield


def open_settings(page) -> None:
    """Unfold the Chat view's settings (folded below the conversation), as a user would."""
    if not page.locator("#chat-settings").evaluate("(node) => node.open"):
        page.click("#chat-settings summary")


@pytest.fixture(scope="module")
def page(ready_page_at):
    page = ready_page_at("/#chat")
    page.click("#tab-chat")
    page.wait_for_function("() => window.candleWeb.chat.runtimeReady")
    page.evaluate("() => localStorage.removeItem('candle-web.chat.v1')")
    page.click("#chat-new")
    open_settings(page)
    return page


def native_runner(model: str):
    """run(messages) -> ids of the answer to the last user message of `messages` (OpenAI
    format), by a fresh native Conversation on `model` (greedy, MAX_TOKENS)."""
    from candle_web.generation import GenerationOptions
    from candle_web.generation.conversation import Conversation
    from candle_web.pipelines import load_llama

    loaded = load_llama(model)
    options = GenerationOptions(max_new_tokens=MAX_TOKENS)

    def run(messages: list) -> list:
        """Ids of the answer to the last user message of `messages` (OpenAI format)."""
        loaded.model.clear_kv_cache()
        chat = Conversation(loaded.model, loaded.tokenizer)
        chat.load_messages(messages[:-1])
        return chat.send(messages[-1]["content"], options).token_ids

    return run


@pytest.fixture(scope="module")
def native():
    """The same conversations natively on SmolLM2, fresh each time (greedy)."""
    return native_runner(MODEL)


def chat_state(page, expression: str):
    return page.evaluate(f"() => {{ const s = window.candleWeb.chat; return {expression}; }}")


def wait_turn(page, click: str, key: str | None = None) -> dict:
    """Start a turn by clicking `click` (or pressing `key` in it) and wait for its end."""
    before = chat_state(page, "s.runs")
    if key is None:
        page.click(click)
    else:
        page.press(click, key)
    page.wait_for_function("(before) => { const s = window.candleWeb.chat;"
                           " return !s.busy && (s.runs > before || s.lastError !== null); }",
                           arg=before, timeout=TURN_TIMEOUT_MS)
    error = chat_state(page, "s.lastError")
    assert error is None, error
    return chat_state(page, "s.lastResult")


def send(page, text: str, enter: bool = False) -> dict:
    page.fill("#chat-input", text)
    if enter:
        return wait_turn(page, "#chat-input", key="Enter")
    return wait_turn(page, "#chat-send")


def assert_whole_prompt_ran(*results) -> None:
    """The page's steps (the wasm part) do not split a prompt exactly: every turn runs its whole
    prompt, as a fresh run does, and says why it reused nothing."""
    for result in results:
        assert result["reusedTokens"] == 0 and result["newTokens"] == result["promptTokens"]
        assert "not reused on this backend" in result["reuseNote"]


def messages_shown(page) -> list:
    return page.evaluate("""() => Array.from(document.querySelectorAll('#chat-turns .chat-message'),
        (li) => [li.classList.contains('chat-user') ? 'user' : 'assistant',
                 li.querySelector('.chat-body').innerText])""")


def test_three_turns_recall_reuse_regenerate_edit_and_reload(page, native, page_ready, report):
    page.fill("#chat-system", SYSTEM)
    page.dispatch_event("#chat-system", "change")
    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    system = {"role": "system", "content": SYSTEM}
    conversation = [system]
    results = []
    for text in ("My name is Ada.", "What is my name?", "Thank you."):
        conversation.append({"role": "user", "content": text})
        if text == "Thank you.":
            # Shift+Enter breaks the line and sends nothing; Enter sends.
            runs = chat_state(page, "s.runs")
            page.fill("#chat-input", "Thank")
            page.press("#chat-input", "Shift+Enter")
            page.type("#chat-input", "you")
            assert page.locator("#chat-input").input_value() == "Thank\nyou"
            assert chat_state(page, "[s.busy, s.runs]") == [False, runs]
        result = send(page, text, enter=text == "Thank you.")
        results.append(result)
        assert result["tokenIds"] == native(conversation), text
        conversation.append({"role": "assistant", "content": result["text"]})
    first, second, third = results
    assert "Ada" in second["text"]  # turn 2 depends on turn 1
    assert_whole_prompt_ran(first, second, third)
    assert second["promptTokens"] > first["promptTokens"] + len(first["tokenIds"])
    reuse = page.locator("#chat-reuse")
    assert reuse.inner_text() == (f"Prompt: {third['promptTokens']} tokens, all read again "
                                  "(no reuse on this backend).")
    assert reuse.get_attribute("title") == third["reuseNote"]
    speed = page.locator("#chat-speed").inner_text()
    assert speed.startswith(f"Answer: {len(third['tokenIds'])} tokens · ") and "tok/s" in speed
    assert len(messages_shown(page)) == 6
    report(f"[ui] chat (SmolLM2 in the browser): turn 2 prompt {second['promptTokens']} tokens, "
           f"all run (no exact prefix reuse on wasm); "
           f"decode {second['timings'].get('tokensPerSecond', 0):.1f} tok/s")

    again = wait_turn(page, ".chat-regenerate")
    assert again["tokenIds"] == third["tokenIds"]
    assert_whole_prompt_ran(again)
    assert len(messages_shown(page)) == 6

    page.click(".chat-message[data-index='0'] .chat-edit")
    page.locator("#chat-edit-note").wait_for(state="visible")
    edited = send(page, "My name is Bob.")
    assert edited["tokenIds"] == native([system, {"role": "user", "content": "My name is Bob."}])
    assert_whole_prompt_ran(edited)
    shown = messages_shown(page)
    assert [role for role, _ in shown] == ["user", "assistant"]
    assert shown[0][1] == "My name is Bob."

    page.reload()
    page_ready(page)
    page.click("#tab-chat")
    page.wait_for_function("() => document.querySelectorAll('#chat-turns .chat-message').length === 2")
    assert messages_shown(page) == shown
    open_settings(page)
    assert page.locator("#chat-system").input_value() == SYSTEM
    titles = page.locator("#chat-list .chat-open").all_inner_texts()
    assert "My name is Bob." in titles
    assert page.locator("#chat-max-tokens").input_value() == str(MAX_TOKENS)  # the chat's own


def test_html_in_answers_is_inert_and_export_import_round_trip(page, tmp_path):
    hostile = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<b>hi</b>"},
        {"role": "assistant", "content": "Here:\n\n<img src=x onerror=\"window.__pwned = 1\">"
                                         "<script>window.__pwned = 2</script>\n\n- **bold** item"
                                         "\n- `code`\n\n```html\n<script>alert(1)</script>\n```"},
    ]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(hostile))
    page.set_input_files("#chat-import", str(path))
    page.wait_for_function("() => document.querySelectorAll('#chat-turns .chat-message').length === 2")
    turns = page.locator("#chat-turns")
    assert turns.locator("img, script").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    answer = turns.locator(".chat-assistant .chat-body")
    assert "<img src=x onerror=" in answer.inner_text()
    assert answer.locator("ul li strong").inner_text() == "bold"
    code = answer.locator("figure.code-block")
    assert code.locator("code").inner_text() == "<script>alert(1)</script>"
    assert code.locator("button.code-copy").count() == 1
    assert turns.locator(".chat-user .chat-body").inner_text() == "<b>hi</b>"

    with page.expect_download() as download:
        page.click("#chat-export")
    exported = tmp_path / "exported.json"
    download.value.save_as(exported)
    assert json.loads(exported.read_text()) == hostile

    (tmp_path / "bad.json").write_text('[{"role": "robot", "content": "x"}]')
    page.set_input_files("#chat-import", str(tmp_path / "bad.json"))
    page.wait_for_function("() => !document.getElementById('chat-error').hidden")
    assert "role \"robot\"" in page.locator("#chat-error").inner_text()

    count = page.locator("#chat-list .chat-open").count()
    page.locator("#chat-list li[aria-current='true'] .chat-delete").click()
    page.wait_for_function("(n) => document.querySelectorAll('#chat-list .chat-open').length"
                           " === n - 1", arg=count)


def test_a_small_context_shows_the_overflow_notice(page):
    page.click("#chat-new")
    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    page.fill("#chat-context", "100")
    notice = page.locator("#chat-notice")
    for text in ("Tell me about the sea.", "Tell me about ships.", "Tell me about birds."):
        result = send(page, text)
    assert result["droppedMessages"] > 0
    assert notice.is_visible() and "left the model's view" in notice.inner_text()
    assert "context of 100 tokens" in notice.inner_text()
    assert len(messages_shown(page)) == 6  # every message is still shown
    page.fill("#chat-context", "")
    # The finished turn left its status and a full bar; a new chat starts with an empty one.
    assert page.locator("#chat-job").get_attribute("data-state") == "done"
    page.click("#chat-new")
    assert page.locator("#chat-job").get_attribute("data-state") == "idle"
    assert page.locator("#chat-phase").inner_text() == IDLE_STATUS
    assert page.evaluate("() => document.getElementById('chat-progress').value") == 0
    assert page.locator("#chat-reuse").inner_text() == "" and not notice.is_visible()


def test_stop_keeps_the_partial_answer_and_the_next_turn_matches(page, native):
    page.click("#chat-new")
    page.fill("#chat-system", "")
    page.dispatch_event("#chat-system", "change")
    page.fill("#chat-max-tokens", "200")
    page.fill("#chat-input", "Write a very long story about a dragon.")
    before = chat_state(page, "s.runs")
    page.click("#chat-send")
    page.wait_for_function("() => window.candleWeb.chat.streamed.tokens >= 3",
                           timeout=TURN_TIMEOUT_MS)
    page.click("#chat-stop")
    page.wait_for_function("(before) => { const s = window.candleWeb.chat;"
                           " return !s.busy && (s.runs > before || s.lastError !== null); }",
                           arg=before, timeout=TURN_TIMEOUT_MS)
    stopped = chat_state(page, "s.lastResult")
    assert chat_state(page, "s.lastError") is None
    assert stopped["stopReason"] == "cancelled" and 3 <= len(stopped["tokenIds"]) < 200
    shown = messages_shown(page)
    assert len(shown) == 2 and shown[1][1].strip() == stopped["text"].strip()
    assert "partial answer is kept" in page.locator("#chat-phase").inner_text()

    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    result = send(page, "Now a short one.")
    conversation = [{"role": "user", "content": "Write a very long story about a dragon."},
                    {"role": "assistant", "content": stopped["text"]},
                    {"role": "user", "content": "Now a short one."}]
    assert_whole_prompt_ran(result)
    assert result["tokenIds"] == native(conversation)


def test_qwen_recalls_a_name_and_a_reloaded_qwen_chat_continues_on_qwen(page, page_ready):
    qwen = "qwen2.5-coder-0.5b-instruct"
    page.click("#chat-new")
    page.select_option("#chat-model", qwen)
    page.fill("#chat-system", "You are a helpful assistant.")
    page.dispatch_event("#chat-system", "change")
    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    page.fill("#chat-context", "")
    conversation = [{"role": "system", "content": "You are a helpful assistant."}]
    results = []
    for text in ("My name is Ada. Please remember it.",
                 "What is my name? Answer with the name only."):
        conversation.append({"role": "user", "content": text})
        results.append(send(page, text))
        conversation.append({"role": "assistant", "content": results[-1]["text"]})
    first, second = results
    assert chat_state(page, "s.loadedModel") == qwen
    assert "Ada" in second["text"]
    assert_whole_prompt_ran(first, second)
    native = native_runner(qwen)
    assert first["tokenIds"] == native(conversation[:2])
    assert second["tokenIds"] == native(conversation[:4])

    # After a reload the conversation reopens on Qwen, and its next turn runs there (a fresh
    # worker: Qwen read from this browser's cache), not on the list's first model.
    page.reload()
    page_ready(page)
    page.click("#tab-chat")
    page.wait_for_function(f"() => document.getElementById('chat-model').value === '{qwen}'")
    assert len(messages_shown(page)) == 4
    text = "Say my name once more."
    conversation.append({"role": "user", "content": text})
    third = send(page, text, enter=True)
    load = chat_state(page, "s.lastLoad")
    assert load["key"] == qwen and load["cached"] is True
    assert third["tokenIds"] == native(conversation)
