"""The answers' Markdown (web/chat/markdown.js) and the Chat view's status line, in the page.

The renderer is the page's own module, imported by the page and run on its DOM (no model needed
for that part): the numbers a reader sees on an ordered list are each `<ol>`'s start plus the
item's place in it, so the tests read those. Found with SmolLM2's and Qwen's answers: a list
whose items were separated by text, blank lines or a code block showed "1." on every item, code
inside an item kept the item's indent, and Generate showed raw ``` fences. The last test runs a
real Generate turn whose greedy SmolLM2 answer holds a fenced Python function.
"""
from __future__ import annotations

import re

import pytest
from tests.ui.text_views_testlib import (leave_page_as_found, open_view, run_and_wait,
                                         view_state)

pytestmark = pytest.mark.ui

MODEL = "smollm2-135m-instruct"
# SmolLM2-135M-Instruct's greedy answer to this opens with a ```python block (checked natively).
CODE_QUESTION = "Write a Python function that adds two numbers."
GENERATE_TIMEOUT_MS = 400_000

# The page's renderer on `text`, in a detached element: what a reader would see of each block.
RENDER_JS = """async (text) => {
    const { renderMarkdown } = await import('/chat/markdown.js');
    const root = document.createElement('div');
    renderMarkdown(root, text);
    const describe = (node) => {
        if (node.tagName === 'OL' || node.tagName === 'UL') {
            return {list: node.tagName.toLowerCase(), start: node.tagName === 'OL' ? node.start : null,
                    items: [...node.children].map((li) => ({
                        text: [...li.childNodes].filter((c) => c.nodeType === 3 || !c.matches('ol, ul, figure'))
                            .map((c) => c.textContent).join(''),
                        inner: [...li.children].filter((c) => c.matches('ol, ul, figure')).map(describe)}))};
        }
        if (node.tagName === 'FIGURE') {
            return {code: node.querySelector('code').textContent,
                    language: node.querySelector('.code-language').textContent};
        }
        return {[node.tagName.toLowerCase()]: node.textContent};
    };
    return [...root.children].map(describe);
}"""


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page):
    yield from leave_page_as_found(ready_page)


# Later modules (test_generate) expect their first SmolLM2 load to download it.
@pytest.fixture(scope="module", autouse=True)
def _model_cache_left_as_found(model_cache_left_as_found):
    yield


def render(page, text: str) -> list:
    return page.evaluate(RENDER_JS, text)


def shown_numbers(blocks: list) -> list:
    """The numbers a reader sees on the ordered lists' items, in order."""
    return [block["start"] + index for block in blocks if block.get("list") == "ol"
            for index in range(len(block["items"]))]


def test_text_and_code_between_numbered_items_stay_in_one_list(ready_page):
    """Chat models write a numbered answer's code and notes unindented between "1." and "2.":
    when the numbering goes on after them they belong to the step above, so the reader sees one
    list 1, 2, 3, 4 with the code and the note inside their steps (not four lists)."""
    answer = ("Steps:\n1. Open the file.\n\n2. Edit it.\nThen save.\n\n"
              "Why this matters: it keeps the history.\n\n3. Commit:\n```sh\ngit commit\n```\n"
              "4. Push.")
    blocks = render(ready_page, answer)
    assert blocks[0] == {"p": "Steps:"} and len(blocks) == 2
    assert shown_numbers(blocks) == [1, 2, 3, 4]
    steps = blocks[1]["items"]
    assert [item["text"] for item in steps] == [
        "Open the file.", "Edit it.Then save.Why this matters: it keeps the history.",
        "Commit:", "Push."]
    assert steps[2]["inner"] == [{"code": "git commit", "language": "sh"}]


def test_a_list_ends_where_its_numbering_does_not_go_on(ready_page):
    """Text after an item, then no next number (or a heading first): the list ends there, and
    a later list keeps its own first number."""
    blocks = render(ready_page, "1. One.\n\nA closing remark.\n\n## Next\n\n2. Two.\n\n"
                                "Done.\n\n```\n1. inside code\n```")
    assert blocks[:3] == [{"list": "ol", "start": 1, "items": [{"text": "One.", "inner": []}]},
                          {"p": "A closing remark."}, {"h5": "Next"}]
    assert blocks[3]["start"] == 2 and blocks[4] == {"p": "Done."}
    assert blocks[5] == {"code": "1. inside code", "language": "code"}
    assert shown_numbers(blocks) == [1, 2]


def test_code_inside_an_item_stays_in_the_list_without_the_items_indent(ready_page):
    answer = ("1. Install it:\n   ```bash\n   pip install candle-web\n   if true; then\n"
              "     echo nested\n   fi\n   ```\n2. Run it:\n   - natively\n   - in the page\n"
              "3. Done.")
    blocks = render(ready_page, answer)
    assert len(blocks) == 1 and shown_numbers(blocks) == [1, 2, 3]
    install, run, done = blocks[0]["items"]
    assert install["text"] == "Install it:"
    # The code's own indentation stays; the three spaces of the item's do not.
    assert install["inner"] == [{"code": "pip install candle-web\nif true; then\n  echo nested\nfi",
                                 "language": "bash"}]
    assert run["inner"] == [{"list": "ul", "start": None, "items": [
        {"text": "natively", "inner": []}, {"text": "in the page", "inner": []}]}]
    assert done == {"text": "Done.", "inner": []}


def test_markers_beyond_the_nesting_limit_stay_text_and_html_stays_inert(ready_page):
    """A line of 20,000 "- " markers renders (as a few nested lists, then text) instead of
    recursing 20,000 deep; an item's HTML is text."""
    blocks = render(ready_page, "- " * 20_000 + "end\n1. <img src=x onerror=\"window.__pwned = 1\">")
    depth, node = 0, blocks[0]
    while node.get("list") and node["items"][0]["inner"]:
        depth, node = depth + 1, node["items"][0]["inner"][0]
    assert depth < 10 and node["items"][0]["text"].endswith("- - end")
    assert blocks[1]["items"][0]["text"] == "<img src=x onerror=\"window.__pwned = 1\">"
    assert ready_page.evaluate("() => window.__pwned") is None


def test_the_status_line_reads_as_two_sentences(ready_page):
    said = ready_page.evaluate("""async () => {
        const { describeAnswer, describePrompt } = await import('/chat/transcript.js');
        return [describePrompt({newTokens: 14, reusedTokens: 312, reuseNote: null}),
                describePrompt({newTokens: 48, reusedTokens: 0, reuseNote: 'not exact here'}),
                describeAnswer(24, 11.96)];
    }""")
    assert said == ["Prompt: 326 tokens: 14 new, 312 reused from the cache.",
                    "Prompt: 48 tokens, all read again (no reuse on this backend).",
                    "Answer: 24 tokens · 12.0 tok/s"]


FENCE = re.compile(r"\s*```\s*([\w+#.-]*)\s*")


def split_fences(text: str) -> tuple:
    """([(language, code)] of the ``` blocks of `text`, the lines outside them): a fence opens
    a block that the next fence line closes, or the end of the text."""
    blocks, prose, lines = [], [], iter(text.split("\n"))
    for line in lines:
        fence = FENCE.fullmatch(line)
        if fence is None:
            prose.append(line)
            continue
        code = []
        for inside in lines:
            if FENCE.fullmatch(inside):
                break
            code.append(inside)
        blocks.append((fence[1], "\n".join(code)))
    return blocks, prose


MARKS = re.compile(r"^\s*(?:#{1,6}\s+|[-*+]\s+|\d{1,9}[.)]\s+)|[*`]")


def markdown_words(lines: list) -> list:
    """The words a reader sees of Markdown `lines` (headings', items' and emphasis marks gone)."""
    return " ".join(MARKS.sub("", line) for line in lines).split()


def test_generate_shows_fenced_code_as_a_code_block(ready_page):
    page = ready_page
    open_view(page, "generate")
    page.fill("#generate-prompt", CODE_QUESTION)
    page.set_checked("#generate-chat", True)
    for selector, value in (("#generate-max-tokens", "40"), ("#generate-temperature", "0"),
                            ("#generate-seed", "1"), ("#generate-top-k", ""),
                            ("#generate-top-p", ""), ("#generate-repeat-penalty", "1")):
        page.fill(selector, value)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    text = state["result"]["text"]
    expected, prose_lines = split_fences(text)
    assert expected and expected[0][0] == "python", text
    output = page.locator("#generate-output")
    codes = output.locator("figure.code-block")
    assert codes.count() == len(expected)
    for index, (language, code) in enumerate(expected):
        assert codes.nth(index).locator("code").inner_text() == code
        assert codes.nth(index).locator(".code-language").inner_text() == language
    # A chat answer is Markdown, as in Chat: no fence is left as text, and the prose around the
    # code reads as written, less its Markdown marks.
    prose = page.evaluate("""() => { const copy = document.getElementById('generate-output').cloneNode(true);
        copy.querySelectorAll('figure').forEach((figure) => figure.remove());
        return [...copy.querySelectorAll('p, li, h4, h5, h6')].map((node) => node.textContent).join(' '); }""")
    assert "```" not in prose
    assert output.evaluate("(node) => node.classList.contains('markdown')")
    assert prose.split() == markdown_words(prose_lines)
    assert view_state(page, "generate", "s.busy") is False
