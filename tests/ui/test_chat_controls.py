"""The Chat view's controls as a person meets them (issue 35, items 4, 7, 8, 12), in headless
Chromium on a page of this module's own; no model runs here (turns, Enter and a reloaded Qwen
chat answering on Qwen are in test_chat.py).

- An imported answer "1." step, its code block, "2." step reads as one list, steps 1 and 2,
  each code block inside its step.
- The conversation comes first: turns, then the message box, then the settings, folded; on a
  phone the list of chats comes after them.
- Clear and delete act at once and offer Undo in place; Undo brings the messages (or the chat)
  back, also after a reload.
- Each conversation keeps its model and settings (opening another chat switches both; a reload
  reopens the chat on its model); Generate keeps its model choice across a reload.
- The open chat looks selected, not like a field in error (no accent-coloured border).
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.ui

QWEN = "qwen2.5-coder-0.5b-instruct"
SMOLLM2 = "smollm2-135m-instruct"
STEPS_ANSWER = ("1. Install numpy:\n\n```bash\npip install numpy\n```\n\n"
                "2. Check the version:\n\n```python\nimport numpy\nprint(numpy.__version__)\n```\n\n"
                "That is all.")
CONVERSATION = [
    {"role": "user", "content": "How do I install numpy and check it, in two steps?"},
    {"role": "assistant", "content": STEPS_ANSWER},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You are welcome."},
]


# Before the page's first load only (this tab's sessionStorage outlives its reloads): no chats
# kept from earlier modules (saved_choices_left_as_found puts them back afterwards).
FORGET_CHATS_ONCE_JS = """if (!sessionStorage.getItem('chats-forgotten')) {
    localStorage.removeItem('candle-web.chat.v1');
    sessionStorage.setItem('chats-forgotten', '1');
}"""


@pytest.fixture(scope="module")
def page(browser_context, network_guard, ui_server_url, page_ready, saved_choices_left_as_found):
    from tests.ui.conftest import PageLog

    page = browser_context.new_page()
    page.page_log = PageLog(page, network_guard)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.add_init_script(FORGET_CHATS_ONCE_JS)
    page.goto(ui_server_url + "/#chat")
    wait_for_chat(page, page_ready)
    yield page
    page.close()


def reload(page, page_ready) -> None:
    page.reload()
    wait_for_chat(page, page_ready)


def wait_for_chat(page, page_ready) -> None:
    """Wait until the Chat view is up with the registry's models listed."""
    page_ready(page)
    page.click("#tab-chat")
    page.wait_for_function(f"() => document.querySelector('#chat-model option[value=\"{QWEN}\"]')"
                           " && document.querySelector('#generate-model option"
                           f"[value=\"{QWEN}\"]')")


def import_conversation(page, tmp_path, messages: list, name: str = "steps.json") -> None:
    path = tmp_path / name
    path.write_text(json.dumps(messages))
    page.set_input_files("#chat-import", str(path))
    page.wait_for_function("(n) => document.querySelectorAll('#chat-turns .chat-message')"
                           ".length === n", arg=len(messages))


def shown_turns(page) -> list:
    return page.eval_on_selector_all("#chat-turns .chat-body", "(bodies) => bodies.map((b) => b.innerText)")


def test_an_imported_numbered_answer_with_code_reads_as_one_list(page, tmp_path):
    import_conversation(page, tmp_path, CONVERSATION)
    answer = page.locator("#chat-turns .chat-assistant .chat-body").first
    lists = answer.locator(":scope > ol")
    assert lists.count() == 1
    steps = lists.locator(":scope > li")
    assert steps.count() == 2 and lists.evaluate("(ol) => ol.start") == 1  # shown as 1. and 2.
    assert [steps.nth(i).locator("code").first.inner_text() for i in range(2)] == [
        "pip install numpy", "import numpy\nprint(numpy.__version__)"]
    assert steps.nth(0).evaluate("(li) => li.firstChild.textContent") == "Install numpy:"
    # Each code block sits inside its step, indented with it, not at the answer's left edge.
    body_left = answer.bounding_box()["x"]
    for i in range(2):
        assert steps.nth(i).locator("figure.code-block").bounding_box()["x"] > body_left + 10
    assert answer.locator(":scope > p").inner_text() == "That is all."


def test_the_conversation_comes_first_and_the_settings_are_folded(page):
    top = {name: page.locator(selector).bounding_box()["y"] for name, selector in (
        ("model", "#chat-model"), ("turns", "#chat-turns"), ("input", "#chat-input"),
        ("settings", "#chat-settings"))}
    assert top["model"] < top["turns"] < top["input"] < top["settings"], top
    assert page.locator("#chat-settings").evaluate("(node) => node.open") is False
    assert not page.locator("#chat-system").is_visible()
    assert not page.locator("#chat-max-tokens").is_visible()
    assert page.locator("#chat-input-note").inner_text() == "Enter sends; Shift+Enter starts a new line."
    # On a phone (one column) the conversation and its box come before the list of chats.
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        side = page.locator(".chat-side").bounding_box()["y"]
        assert page.locator("#chat-turns").bounding_box()["y"] < page.locator("#chat-input").bounding_box()["y"] < side
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})


def test_the_open_chat_looks_selected_not_in_error(page):
    page.click("#chat-new")  # two chats: the new one open, the imported one not
    style = """(button) => { const s = getComputedStyle(button);
        return {border: s.borderColor, background: s.backgroundColor, shadow: s.boxShadow}; }"""
    selected = page.locator("#chat-list li[aria-current='true'] .chat-open").evaluate(style)
    other = page.locator("#chat-list li:not([aria-current]) .chat-open").first.evaluate(style)
    accent = page.evaluate("""() => { const probe = document.createElement('span');
        probe.style.color = 'var(--accent)'; document.body.append(probe);
        const color = getComputedStyle(probe).color; probe.remove(); return color; }""")
    assert selected["border"] == other["border"] != accent
    assert selected["background"] != other["background"] and "inset" in selected["shadow"]
    page.locator("#chat-list li:not([aria-current]) .chat-open").first.click()


def test_clear_and_delete_offer_undo(page, page_ready):
    assert len(shown_turns(page)) == 4
    undo = page.locator("#chat-undo")
    page.click("#chat-clear")
    assert shown_turns(page) == [] and undo.is_visible()
    assert undo.inner_text().startswith("Cleared 4 messages.")
    assert page.evaluate("() => document.activeElement.id") == "chat-undo-button"
    page.click("#chat-undo-button")
    assert len(shown_turns(page)) == 4 and not undo.is_visible()

    title = page.locator("#chat-list li[aria-current='true'] .chat-open").inner_text()
    count = page.locator("#chat-list .chat-open").count()
    page.locator("#chat-list li[aria-current='true'] .chat-delete").click()
    removed = page.locator("#chat-list .chat-removed")
    assert removed.inner_text().startswith(f"Deleted “{title}”.")
    assert page.locator("#chat-list .chat-open").count() == count - 1
    assert title not in page.locator("#chat-list .chat-open").all_inner_texts()
    assert page.evaluate("() => document.activeElement.className") == "chat-undo-delete"
    removed.locator("button").click()
    assert page.locator("#chat-list .chat-removed").count() == 0
    assert page.locator("#chat-list li[aria-current='true'] .chat-open").inner_text() == title
    assert len(shown_turns(page)) == 4

    reload(page, page_ready)  # what Undo brought back was saved
    assert page.locator("#chat-list li[aria-current='true'] .chat-open").inner_text() == title
    assert len(shown_turns(page)) == 4
    # The offer lasts until the next change: deleted, then a new chat, and it is gone.
    page.locator("#chat-list li[aria-current='true'] .chat-delete").click()
    page.click("#chat-new")
    assert page.locator("#chat-list .chat-removed").count() == 0


def settings(page) -> dict:
    return {"model": page.locator("#chat-model").input_value(),
            "maxTokens": page.locator("#chat-max-tokens").input_value(),
            "temperature": page.locator("#chat-temperature").input_value()}


def set_setting(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.dispatch_event(selector, "change")  # what leaving the box does


def test_each_chat_keeps_its_model_and_settings_and_generate_its_model(page, page_ready, tmp_path):
    page.click("#chat-settings summary")
    page.click("#chat-new")
    page.select_option("#chat-model", QWEN)
    set_setting(page, "#chat-max-tokens", "77")
    set_setting(page, "#chat-temperature", "0.7")
    import_conversation(page, tmp_path, CONVERSATION[:2], "qwen.json")  # takes the form's settings
    qwen_title = page.locator("#chat-list li[aria-current='true'] .chat-open").inner_text()
    page.click("#chat-new")
    assert settings(page) == {"model": QWEN, "maxTokens": "77", "temperature": "0.7"}  # inherited
    page.select_option("#chat-model", SMOLLM2)
    set_setting(page, "#chat-max-tokens", "33")
    set_setting(page, "#chat-temperature", "0")

    page.locator("#chat-list .chat-open", has_text=qwen_title).click()
    assert settings(page) == {"model": QWEN, "maxTokens": "77", "temperature": "0.7"}
    page.locator("#chat-list .chat-open").first.click()  # the newest: the SmolLM2 chat
    assert settings(page) == {"model": SMOLLM2, "maxTokens": "33", "temperature": "0"}
    page.locator("#chat-list .chat-open", has_text=qwen_title).click()

    page.click("#tab-generate")
    page.select_option("#generate-model", QWEN)
    reload(page, page_ready)
    assert page.locator("#chat-list li[aria-current='true'] .chat-open").inner_text() == qwen_title
    assert settings(page) == {"model": QWEN, "maxTokens": "77", "temperature": "0.7"}
    assert "does not offer" not in page.locator("#chat-model-note").inner_text()
    assert page.locator("#generate-model").input_value() == QWEN
