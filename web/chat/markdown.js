// Markdown for the Chat view's answers, built as DOM nodes: every piece of model text becomes
// a text node (never innerHTML), so "<script>" or "<img onerror=...>" in an answer shows as
// text and runs nothing. The subset chat models write: paragraphs, #-headings, "-"/"*"/"1."
// lists, ``` fenced code blocks (with a copy button), `inline code`, **bold** and *italic*.

const FENCE = /^(\s*)```\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
// A list item: its indent, its marker (a bullet, or a number and "." or ")") and its text.
const ITEM = /^(\s*)([-*+]|(\d{1,9})[.)])(\s+)(.*)$/;
// Lists inside list items are parsed to this depth; deeper markers stay text (a line of
// thousands of "- " must not recurse thousands of times).
const MAX_LIST_DEPTH = 8;
// Inline spans, tried left to right: code first (its content is literal), then bold, italic.
const INLINE = /(`+)([^`]+?)\1|\*\*([^*]+?)\*\*|__([^_]+?)__|\*([^*\s][^*]*?)\*/g;

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// Appends `text` with its inline spans to `parent`, as text nodes and elements only.
export function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(document.createTextNode(text.slice(last, match.index)));
    const [, , code, bold, boldAlt, italic] = match;
    let node;
    if (code !== undefined) {
      node = element("code");
      node.textContent = code;
    } else if (bold !== undefined || boldAlt !== undefined) {
      node = element("strong");
      appendInline(node, bold ?? boldAlt);
    } else {
      node = element("em");
      appendInline(node, italic);
    }
    parent.append(node);
    last = match.index + match[0].length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

// A code block with its language label and a copy button (the clipboard gets the raw text).
function codeBlock(code, language) {
  const figure = element("figure", "code-block");
  const bar = element("div", "code-bar");
  const label = element("span", "code-language");
  label.textContent = language || "code";
  const copy = element("button", "code-copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy the ${language || "code"} block`);
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => { copy.textContent = "Copy"; }, 1500);
  });
  bar.append(label, copy);
  const pre = element("pre");
  const codeNode = element("code");
  codeNode.textContent = code;
  pre.append(codeNode);
  figure.append(bar, pre);
  figure.dataset.code = code;
  return figure;
}

const indentOf = (line) => line.length - line.trimStart().length;
const isBlank = (line) => line.trim() === "";

// Removes up to `width` leading spaces (the indent a fence or a list item's content has).
function dedent(line, width) {
  return line.slice(Math.min(width, indentOf(line)));
}

function matchItem(line, depth) {
  const match = depth < MAX_LIST_DEPTH ? line.match(ITEM) : null;
  if (!match) return null;
  const [, indent, marker, number, gap, text] = match;
  // The item's content column: lines indented this far belong to it (a code block, a nested list).
  return { ordered: number !== undefined, number: number === undefined ? null : Number(number),
           content: indent.length + marker.length + Math.min(gap.length, 4), text };
}

// The lines after an item's first line that belong to it, dedented to its content column:
// lines indented at least that far (blank lines between them included), and plain text right
// below the item (a lazy continuation of its first paragraph).
function itemBody(lines, from, item, depth) {
  const body = [item.text];
  let i = from;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      let next = i;
      while (next < lines.length && isBlank(lines[next])) next += 1;
      if (next === lines.length || indentOf(lines[next]) < item.content) break;
      for (; i < next; i += 1) body.push("");
    } else if (indentOf(line) >= item.content) {
      body.push(dedent(line, item.content));
      i += 1;
    } else if (!isBlank(body.at(-1)) && !FENCE.test(line) && !HEADING.test(line)
               && !matchItem(line, depth)) {
      body.push(line.trim());
      i += 1;
    } else {
      break;
    }
  }
  return { body, next: i };
}

// Where the lines that follow an ordered list's item at `from` end: at the next line that is a
// list item or a heading outside a fence (or the end), and whether that line is the list's next
// number. Chat models write a numbered answer's code and notes unindented between "1." and
// "2."; when the numbering goes on after them they belong to the item above (one list, as the
// model meant it), not between two lists.
function interludeBeforeNextItem(lines, from, list, depth) {
  let fenced = false;
  let i = from;
  for (; i < lines.length; i += 1) {
    if (FENCE.test(lines[i])) fenced = !fenced;
    else if (!fenced && (HEADING.test(lines[i]) || matchItem(lines[i], depth))) break;
  }
  const item = i < lines.length ? matchItem(lines[i], depth) : null;
  const expected = list.start + list.items.length;
  return { end: i, continues: item !== null && item.ordered && item.number === expected };
}

// The line after the fenced block opening at `from` (after its closing fence, or the end).
function fenceEnd(lines, from) {
  let i = from + 1;
  while (i < lines.length && !FENCE.test(lines[i])) i += 1;
  return Math.min(i + 1, lines.length);
}

// Splits lines into blocks: {type: "code"|"heading"|"list"|"paragraph", ...}. An open fence
// (an answer still streaming, or cut by the token limit) runs to the end; a fence's code loses
// the fence's own indent. List items hold blocks of their own; items of one kind separated only
// by blank lines are one list, and an ordered list starts at its first item's number. Code and
// paragraphs between "1." and "2." go into item 1 (interludeBeforeNextItem), so the list shows
// 1 and 2 with the code indented under its step; so does code right below an item whose text
// ends in ":".
function parseLines(lines, depth) {
  const blocks = [];
  let paragraph = [];
  let list = null; // the list the next item joins (blank lines keep it open, anything else ends it)
  const flush = () => {
    if (paragraph.length) blocks.push({ type: "paragraph", text: paragraph.join("\n") });
    paragraph = [];
  };
  for (let i = 0; i < lines.length;) {
    const line = lines[i];
    if (list?.ordered && !isBlank(line) && !HEADING.test(line) && !matchItem(line, depth)) {
      const { end, continues } = interludeBeforeNextItem(lines, i, list, depth);
      const last = list.items.at(-1);
      // The last step's code, announced by its text ("2. Import it:"), is that step's too.
      const lastBlock = last.blocks.at(-1);
      const announced = FENCE.test(line) && lastBlock?.type === "paragraph" && /:\s*$/.test(lastBlock.text);
      if (continues || announced) {
        const until = continues ? end : fenceEnd(lines, i);
        flush();
        last.blocks.push(...parseLines(lines.slice(i, until), depth + 1));
        i = until;
        continue;
      }
    }
    const fence = line.match(FENCE);
    const heading = line.match(HEADING);
    const item = matchItem(line, depth);
    if (fence) {
      flush();
      const code = [];
      for (i += 1; i < lines.length && !FENCE.test(lines[i]); i += 1) code.push(dedent(lines[i], fence[1].length));
      i += 1; // the closing fence
      blocks.push({ type: "code", language: fence[2], text: code.join("\n") });
      list = null;
    } else if (item) {
      flush();
      const { body, next } = itemBody(lines, i + 1, item, depth);
      const entry = { blocks: parseLines(body, depth + 1) };
      if (list === null || list.ordered !== item.ordered) {
        list = { type: "list", ordered: item.ordered, start: item.number, items: [] };
        blocks.push(list);
      }
      list.items.push(entry);
      i = next;
    } else if (isBlank(line)) {
      flush();
      i += 1;
    } else if (heading) {
      flush();
      blocks.push({ type: "heading", level: heading[1].length, text: heading[2] });
      list = null;
      i += 1;
    } else {
      paragraph.push(line);
      list = null;
      i += 1;
    }
  }
  flush();
  return blocks;
}

export function parseBlocks(text) {
  return parseLines(text.replace(/\r\n?/g, "\n").split("\n"), 0);
}

function paragraphInto(node, text) {
  text.split("\n").forEach((line, index) => {
    if (index > 0) node.append(element("br"));
    appendInline(node, line);
  });
  return node;
}

function blockNode(block) {
  if (block.type === "code") return codeBlock(block.text, block.language);
  if (block.type === "heading") {
    const node = element(`h${Math.min(block.level + 3, 6)}`);
    appendInline(node, block.text);
    return node;
  }
  if (block.type === "list") {
    const list = element(block.ordered ? "ol" : "ul");
    if (block.ordered && block.start !== 1) list.start = block.start;
    for (const item of block.items) {
      const li = element("li");
      // An item's first paragraph is its text; what follows it (code, a nested list, more
      // paragraphs) comes as blocks inside the item.
      const [first, ...rest] = item.blocks;
      const blocks = first?.type === "paragraph" ? (paragraphInto(li, first.text), rest) : item.blocks;
      li.append(...blocks.map(blockNode));
      list.append(li);
    }
    return list;
  }
  return paragraphInto(element("p"), block.text);
}

// Replaces `container`'s children with the rendered answer.
export function renderMarkdown(container, text) {
  container.replaceChildren(...parseBlocks(text).map(blockNode));
}

// Generate's output: the text as written (its spaces and line breaks kept by the container's
// style), except that ``` fenced code becomes a code block with its copy button, as in Chat.
export function renderFencedCode(container, text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const nodes = [];
  let plain = [];
  const flush = () => {
    if (plain.length) nodes.push(document.createTextNode(plain.join("\n")));
    plain = [];
  };
  for (let i = 0; i < lines.length; i += 1) {
    const fence = lines[i].match(FENCE);
    if (!fence) {
      plain.push(lines[i]);
      continue;
    }
    flush();
    const code = [];
    for (i += 1; i < lines.length && !FENCE.test(lines[i]); i += 1) code.push(dedent(lines[i], fence[1].length));
    nodes.push(codeBlock(code.join("\n"), fence[2]));
  }
  flush();
  container.replaceChildren(...nodes);
}
